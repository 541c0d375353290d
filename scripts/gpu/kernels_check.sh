#!/usr/bin/env bash
# The one command a GPU session runs: compile the Triton kernels, test them against their torch twins at
# realistic sizes (exact verification tokens, attention within 2x the twin's error), then print the benchmark.
# Needs a CUDA build of torch and triton in the active environment (pip install -e '.[triton,dev]').
set -euo pipefail
cd "$(dirname "$0")/../.."
python - <<'PY'
import sys, torch
try:
    import triton
except ImportError:
    sys.exit("triton does not import: pip install -e '.[triton,dev]' with a CUDA build of torch")
if not torch.cuda.is_available():
    sys.exit(f"no CUDA device visible to torch {torch.__version__}: this script checks the compiled kernels")
print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name(0)}")
PY
python -m pytest -q -m gpu tests/test_kernels.py
python -m portable_spec.cli bench kernels
