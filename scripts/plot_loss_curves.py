"""Plot the training curves `portable-spec train` logs (<work-dir>/<out>-loss.jsonl), one line per drafter.

python scripts/plot_loss_curves.py runs/smollm2/*-loss.jsonl --out docs/benchmarks/smollm2_training.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from portable_spec.training.work_dir import WorkDir  # noqa: E402


def read_curve(path: Path, smooth: int) -> tuple[list[int], list[float]]:
    by_step = {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        by_step[entry["step"]] = entry["loss"]  # a resumed run logs some steps twice: the last one counts
    steps = sorted(by_step)
    losses = [by_step[s] for s in steps]
    averaged = [
        sum(losses[max(0, i - smooth + 1) : i + 1]) / len(losses[max(0, i - smooth + 1) : i + 1])
        for i in range(len(losses))
    ]
    return steps, averaged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smooth", type=int, default=25, help="moving-average window in steps")
    args = parser.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    for log in args.logs:
        steps, losses = read_curve(log, args.smooth)
        ax.plot(steps, losses, label=log.name.removesuffix(WorkDir.LOSS_LOG))
    ax.set(xlabel="step", ylabel=f"weighted CE (moving average, {args.smooth} steps)", title="drafter training loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
