"""Copy drafters trained by `portable-spec train` into portable_spec/assets/smollm2 (float weights as bf16 to keep
the package small; d2t stays int64) and write MANIFEST.json from the work directory's records.

    python scripts/ship_smollm2_drafters.py --work-dir runs/smollm2 --seconds-json runs/smollm2/seconds.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from portable_spec.core.checkpoint import save_drafter
from portable_spec.core.spec import VARIANT_KINDS, read_config
from portable_spec.training.distill_data import load_sequences

ASSETS = Path(__file__).resolve().parents[1] / "portable_spec" / "assets" / "smollm2"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--seconds-json", type=Path, default=None, help="{kind: training seconds}, if recorded")
    args = parser.parse_args()
    sequences = load_sequences(args.work_dir / "data", featurised_only=True)
    reply_tokens = int((sequences.offsets[1:] - sequences.offsets[:-1] - sequences.prompt_lens).sum())
    manifest = {
        "train_prompts": len(sequences),
        "reply_tokens": reply_tokens,
        "prompt_tokens": int(sequences.prompt_lens.sum()),
        "drafters": {},
    }
    seconds = json.loads(args.seconds_json.read_text()) if args.seconds_json else {}
    for kind in VARIANT_KINDS:
        source = args.work_dir / "drafters" / kind
        config = read_config(source)
        weights = load_file(str(source / "model.safetensors"))
        shipped = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in weights.items()}
        save_drafter(ASSETS / "drafters" / kind, config, shipped)
        losses = [json.loads(line) for line in (args.work_dir / f"{kind}-loss.jsonl").read_text().splitlines()]
        last = {e["step"]: e["loss"] for e in losses}
        tail = [last[s] for s in sorted(last)[-50:]]
        state = json.loads((args.work_dir / f"state-{kind}" / "trainer_state.json").read_text())
        manifest["drafters"][kind] = {
            "params": sum(v.numel() for k, v in weights.items() if v.is_floating_point()),
            "intermediate_size": config.intermediate_size,
            "steps": state["step"],
            "final_loss_mean_last_50": round(sum(tail) / len(tail), 4),
            "train_seconds": seconds.get(kind),
        }
    (ASSETS / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
