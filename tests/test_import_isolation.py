"""Importing the core (every module, including the CLI) must import no engine and no Triton."""

import subprocess
import sys

ENGINES = ("vllm", "sglang", "tensorrt_llm", "triton")


def test_core_imports_no_engine():
    code = (
        "import importlib, pkgutil, sys, portable_spec\n"
        "for m in pkgutil.walk_packages(portable_spec.__path__, 'portable_spec.'):\n"
        "    importlib.import_module(m.name)\n"
        "import adapters\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {ENGINES!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
