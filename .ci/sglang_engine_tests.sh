#!/usr/bin/env bash
# SGLang adapter engine tests on a CPU machine: build a venv with sglang 0.5.23 the way docs/backends/sglang.md
# describes (sglang without its CUDA deps + its pure-Python deps + an import-only torchvision stand-in), install
# portable-spec editable (so the sglang.srt.plugins entry point is real), run the `engine` tests.
#   bash .ci/sglang_engine_tests.sh                      # venv in $SGLANG_VENV (default: /tmp/portable-spec-sglang)
#   SGLANG_VENV=/work/venvs/sglang bash .ci/sglang_engine_tests.sh   # reuse one; FRESH=1 rebuilds it
# Measured on a 2-core shared CPU machine: see docs/backends/sglang.md ("Engine tests on CPU").
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV=${SGLANG_VENV:-/tmp/portable-spec-sglang}
start=$(date +%s)
stamp() { echo "[sglang-ci] $(( $(date +%s) - start ))s: $*"; }

if [[ "${FRESH:-0}" == 1 ]]; then rm -rf "$VENV"; fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q torch==2.13.0                     # the CPU wheel; sglang's own pin (torch==2.14.1) would pull CUDA
stamp "torch"
pip install -q --no-deps sglang==0.5.23          # no sgl-kernel, flashinfer, ...: CUDA-only, not on the tested path
pip install -q torch==2.13.0 transformers==5.19.0 numpy pydantic requests tqdm orjson pyzmq psutil fastapi \
    "uvicorn>=0.51" uvloop msgspec pybase64 setproctitle einops safetensors sentencepiece==0.2.1 \
    tokenizers==0.23.2 python-multipart aiohttp interegular partial_json_parser prometheus-client packaging \
    pillow scipy xxhash pyyaml regex tiktoken blobfile==3.0.0 distro "python-dateutil<3" watchfiles zstandard \
    easydict openai==2.8.0 "anthropic>=0.20.0" openai-harmony==0.0.4 "llguidance<2,>=1.7.6" xgrammar==0.2.7 \
    gguf compressed-tensors==0.18.0 nvidia-ml-py IPython dill pytest
stamp "sglang + deps"

# sglang imports torchvision at import time (multimodal utils); PyPI's torchvision links CUDA libraries that the
# CPU torch lacks (`operator torchvision::nms does not exist`). The DFlash path never calls it: an inert stand-in.
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/torchvision"
cat > "$site/torchvision/__init__.py" <<'EOF'
"""Import-only stand-in for torchvision written by portable-spec's .ci/sglang_engine_tests.sh (NOT the real
package): every submodule and attribute is an inert dummy that raises when called."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class _DummyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __iter__(cls):
        return iter(())


class _Dummy(metaclass=_DummyMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision stand-in: not available in this CPU test venv")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Dummy


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())
EOF
pip install -q --no-deps -e .
stamp "venv ready ($(python -c 'from importlib.metadata import version as v; print("sglang", v("sglang"), "torch", v("torch"))'))"

python -m pytest -q -p no:cacheprovider -m engine tests/engines/test_sglang_adapter.py
stamp "engine tests passed"
