#!/usr/bin/env bash
# The upstream-oracle stage: the upstream packages' own drafter code, each in the venv its pins need, as the oracle
# of the `upstream/*` conformance rows (portable_spec/conformance/upstream_oracle/). Builds (or reuses) one venv per
# package under $UPSTREAM_VENVS, then runs tests/test_upstream_oracle.py (-m upstream) and checks that the committed
# report's upstream rows are what this run shows, for the reference and ONNX columns.
#   bash .ci/upstream_oracle_tests.sh                    # venvs in $UPSTREAM_VENVS (default: .venv-upstream)
#   FRESH=1 bash .ci/upstream_oracle_tests.sh            # rebuild them
# The pins: dflash 0.1.0 takes transformers==5.15.0 (its `local` extra); speculators 0.9.0 transformers<=5.19
# (torchvision/torchaudio left out: its DFlash code imports neither); specforge 0.2.0 pins torch 2.11.0 (a CUDA
# build here) and sglang 0.5.14 (GPU only), so it gets torch 2.13.0+cpu, its transformers==5.8.1 and --no-deps:
# its modeling and training-mask code import torch and transformers only.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
ROOT=${UPSTREAM_VENVS:-$PWD/.venv-upstream}
start=$(date +%s)
stamp() { echo "[upstream-ci] $(( $(date +%s) - start ))s: $*"; }

venv() {  # venv NAME PIP-ARGS...: a venv with torch 2.13.0+cpu, then the package's own pins
  local dir="$ROOT/$1"; shift
  if [[ "${FRESH:-0}" == 1 ]]; then rm -rf "$dir"; fi
  if [[ ! -f "$dir/.ready" ]]; then
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q torch==2.13.0
    "$dir/bin/pip" install -q "$@"
    touch "$dir/.ready"
  fi
}
venv dflash "dflash==0.1.0" "transformers==5.15.0" safetensors torch==2.13.0
venv speculators --no-deps "speculators==0.9.0"
[[ -f "$ROOT/speculators/.deps" ]] || { "$ROOT/speculators/bin/pip" install -q torch==2.13.0 "transformers==5.19.0" \
  safetensors aiohttp click "datasets<=5.1.0,>=4.0.0" httpx huggingface-hub "loguru<=0.7.3,>=0.7.2" \
  "numpy<=2.5.4,>=2.0.0" "openai>=2.0.0" protobuf psutil pydantic pydantic-settings rich "tqdm<=4.70.1" \
  "typer>=0.12.0" "hs-connectors==0.9.0" && touch "$ROOT/speculators/.deps"; }
venv specforge --no-deps "specforge==0.2.0"
[[ -f "$ROOT/specforge/.deps" ]] || { "$ROOT/specforge/bin/pip" install -q torch==2.13.0 "transformers==5.8.1" \
  safetensors typing-extensions && touch "$ROOT/specforge/.deps"; }
stamp "venvs ready: $(for p in dflash speculators specforge; do "$ROOT/$p/bin/python" -c "from importlib.metadata import version as v; print('$p', v('$p'), 'transformers', v('transformers'), end='; ')"; done)"

export PORTABLE_SPEC_UPSTREAM_VENVS="$ROOT"
# the portable-spec side runs in the project's venv: .ci/run has it active; run by hand, take .venv if it exists
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then . .venv/bin/activate; fi
python -m pytest -q -p no:cacheprovider -m upstream tests/test_upstream_oracle.py tests/conformance/test_backends.py
stamp "oracle tests passed"
portable-spec conformance --backends reference onnx --checks 'upstream/*' --output - --check-report docs/conformance.md | tail -3
stamp "upstream rows current (reference, onnx)"
