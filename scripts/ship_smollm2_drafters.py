"""Copy drafters trained by `portable-spec train` into portable_spec/assets/smollm2 (float weights as bf16 to keep
the package small; d2t stays int64) and record them in MANIFEST.json from the work directory's records.

    python scripts/ship_smollm2_drafters.py --work-dir runs/smollm2 --seconds-json runs/smollm2/seconds.json
    python scripts/ship_smollm2_drafters.py --work-dir runs/more   # the recipe's kinds (recipe.json), warm starts

A run trained from scratch replaces the shipped drafter and the manifest's data figures. A run warm-started from
the shipped drafter (`--init-from portable_spec/assets/smollm2/drafters/KIND`) replaces it only when its best
held-out tau beats the shipped drafter's own on the same held-out sequences (the held-out log's first evaluation);
either way the run's figures are appended to that drafter's `warm_starts` in the manifest.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from portable_spec.core.checkpoint import save_drafter_cast
from portable_spec.core.spec import VARIANT_KINDS, read_config, read_json_object
from portable_spec.training.heldout import improved_on_start, summarize_heldout_log
from portable_spec.training.replies import load_sequences
from portable_spec.training.work_dir import WorkDir

ASSETS = Path(__file__).resolve().parents[1] / "portable_spec" / "assets" / "smollm2"
RECIPE = ASSETS / "recipe.json"  # the shipped drafters' recipe: which kinds are shipped, and how they were trained


def recipe_kinds() -> list[str]:
    """The kinds the shipped recipe trains (its `kinds`), the ones shipped by default."""
    return list(read_json_object(RECIPE, "restore it from git").get("kinds", {}))


def data_figures(work_dir: Path) -> dict:
    sequences = load_sequences(WorkDir(work_dir).replies, featurised_only=True)
    return {
        "train_prompts": len(sequences),
        "reply_tokens": int((sequences.offsets[1:] - sequences.offsets[:-1] - sequences.prompt_lens).sum()),
        "prompt_tokens": int(sequences.prompt_lens.sum()),
    }


def loss_tail_mean(loss_file: Path) -> float:
    """Mean loss of the last 50 steps of a `<kind>-loss.jsonl`, each step once (a resumed run logs the steps since
    its last save again: the later line wins)."""
    losses = [json.loads(line) for line in loss_file.read_text().splitlines() if line.strip()]
    last = {e["step"]: e["loss"] for e in losses}
    tail = [last[s] for s in sorted(last)[-50:]]
    return round(sum(tail) / len(tail), 4)


def record_warm_start(record: dict, run: dict) -> bool:
    """The one rule both shipping paths (this script, scripts/gpu/session.py) follow: a warm-started run's figures
    go to its drafter's `warm_starts`; when it beat the shipped drafter held out (`replaced_shipped`), the shipped
    drafter's steps grow by the run's steps up to its best drafter and its held-out tau becomes the run's. Returns
    whether the run's drafter is to be shipped (False for a run already recorded)."""
    if run in record.setdefault("warm_starts", []):
        return False
    record["warm_starts"].append(run)
    if run["replaced_shipped"]:
        record["steps"] += run["heldout_tau_best_step"]
        record["heldout_tau"] = run["heldout_tau"]
    return bool(run["replaced_shipped"])


def run_figures(work_dir: Path, kind: str, seconds: float | None) -> tuple[dict, str | None]:
    """The run's steps, seconds and last-50-step loss, and the drafter it was warm-started from (None: scratch)."""
    state = json.loads((WorkDir(work_dir).state(kind) / "trainer_state.json").read_text())
    figures = {
        "steps": state["step"],
        "final_loss_mean_last_50": loss_tail_mean(WorkDir(work_dir).loss_log(kind)),
        "train_seconds": seconds if seconds is not None else round(state.get("elapsed_seconds", 0.0), 1) or None,
    }
    return figures, state["train_config"].get("init_from")


def ship(source: Path, assets: Path, kind: str) -> int:
    """The drafter at source into the package, floats as bf16; returns its trainable parameter count."""
    shipped = save_drafter_cast(source, assets / "drafters" / kind, force=True)
    return sum(v.numel() for v in shipped.values() if v.is_floating_point())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=VARIANT_KINDS,
        default=None,
        help="Default: the kinds of assets/smollm2/recipe.json.",
    )
    parser.add_argument("--assets", type=Path, default=ASSETS, help="Where the shipped drafters live")
    parser.add_argument("--seconds-json", type=Path, default=None, help="{kind: training seconds}, if recorded")
    args = parser.parse_args(argv)
    args.kinds = args.kinds or recipe_kinds()
    manifest_file = args.assets / "MANIFEST.json"
    manifest = json.loads(manifest_file.read_text()) if manifest_file.exists() else {"drafters": {}}
    data = data_figures(args.work_dir)
    seconds = json.loads(args.seconds_json.read_text()) if args.seconds_json else {}
    for kind in args.kinds:
        source = args.work_dir / "drafters" / kind
        figures, init_from = run_figures(args.work_dir, kind, seconds.get(kind))
        if init_from is None:
            params = ship(source, args.assets, kind)
            manifest.update(data)
            manifest["drafters"][kind] = {
                "params": params,
                "intermediate_size": read_config(source).intermediate_size,
                **figures,
            }
            continue
        shipped_dir = (args.assets / "drafters" / kind).resolve()
        if Path(init_from).resolve() != shipped_dir:
            raise SystemExit(f"error: {kind} was warm-started from {init_from}, not the shipped {shipped_dir}")
        held_out = summarize_heldout_log(WorkDir(args.work_dir).heldout_log(kind))
        if not held_out:
            raise SystemExit(f"error: {kind} has no held-out log in {args.work_dir}: nothing says it beats the shipped")
        run = {**data, **figures, **held_out, "replaced_shipped": improved_on_start(held_out)}
        if run in manifest["drafters"][kind].get("warm_starts", []):
            print(f"{kind}: this run is already in the manifest; nothing changed")
        elif record_warm_start(manifest["drafters"][kind], run):
            ship(source, args.assets, kind)  # the best drafter by held-out tau, written at its step
    manifest_file.write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
