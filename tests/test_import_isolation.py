"""The core (every module, the CLI included) imports no engine, and works with engines and Triton unimportable.

transformers itself may import triton through torch._dynamo when triton is installed, so the Triton half of
the promise is checked by making triton unimportable and showing the core still imports and decodes."""

import subprocess
import sys

ENGINES = ("vllm", "sglang", "tensorrt_llm")

# every core, conformance and CLI module, and each adapter's entry module (engine-side modules such as
# adapters/vllm/draft_model.py import their engine by design, and kernels/*_triton.py import triton)
IMPORT_ALL = (
    "import importlib, pkgutil, sys, portable_spec\n"
    "for m in pkgutil.walk_packages(portable_spec.__path__, 'portable_spec.'):\n"
    "    if not m.name.startswith(('portable_spec.adapters.', 'portable_spec.kernels.')) "
    "and not m.name.endswith('__main__'):\n"
    "        importlib.import_module(m.name)\n"
    "import portable_spec.adapters.onnx, portable_spec.adapters.tensorrt_llm, portable_spec.adapters.vllm\n"
    "import portable_spec.adapters.sglang, portable_spec.kernels.bench\n"
)

BLOCK = (
    "import sys\n"
    "class Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.split('.')[0] in {ENGINES + ('triton',)!r}:\n"
    "            raise ImportError(f'{name} is blocked in this test')\n"
    "sys.meta_path.insert(0, Block())\n"
)

DECODE = (
    "from portable_spec.core.testing import tiny_target, tiny_drafter\n"
    "from portable_spec.core.decode import SpeculativeDecoder, GenerationConfig\n"
    "t = tiny_target()\n"
    "out = SpeculativeDecoder(t, tiny_drafter(t, 'depth_causal')).generate([[1, 2, 3]], GenerationConfig(max_new_tokens=4))\n"
    "print(len(out.tokens[0]))\n"
)


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_core_imports_no_engine():
    loaded = _run(IMPORT_ALL + f"print(sorted(n for n in sys.modules if n.split('.')[0] in {ENGINES!r}))")
    assert loaded == "[]"


def test_core_runs_with_engines_and_triton_unimportable():
    assert _run(BLOCK + IMPORT_ALL + DECODE).splitlines()[-1] == "4"
