"""The equal-budget comparison of the single-pass kinds on SmolLM2 (issue 45): parallel (DFlash), depth_causal (ours),
dflash2 (z-lab), dspark (speculators) and depthwise (a dflash2 trained with --depthwise-shift-mix: depth_causal's
shift-mix made depthwise, item 6), each trained from scratch (the same initialisation rule) on the same data,
at the same depth and MLP width, for the same seconds of training (`--time-budget`: a cheaper kind takes more steps
of the same batch sequence; the learning-rate schedule follows elapsed time), at blocks 4 and 8; held-out acceptance
(tau and per slot) from each run's own held-out evaluation at the end, the steps each run took and the drafter's
cost per pass measured here, written as one markdown table.

    python scripts/equal_budget.py --work-dir runs/equal --seconds 900 --out table.md

Seconds are wall-clock seconds of the training loop alone (held-out evaluations are outside it): two runs share the
2 cores, one thread each, so anything else running on the machine takes time from both; keep it quiet.

The data stage runs once, first (`portable-spec train ... --until features`, replies from vLLM when it is
importable); then two runs at a time, one thread each (OMP_NUM_THREADS=1). Every kind scores the full vocabulary
(DFlash2 requires it, so all do). Runs resume from their work dir. The decode speedups are `portable-spec bench
decode --drafter NAME=DIR ...` on the drafters written here; docs/benchmarks/equal_budget/equal_budget.md has both
and what limits them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from portable_spec.training.work_dir import WorkDir

KINDS = ("parallel", "depth_causal", "dflash2", "dspark", "depthwise")
# a row's training flags: its kind, or for "depthwise" (issue 45 item 6) a dflash2 with its dynamic kernel
# projections and selector held at zero, i.e. depth_causal's shift-mix made depthwise (train --depthwise-shift-mix)
ROW_FLAGS = {kind: ["--kind", kind] for kind in KINDS} | {"depthwise": ["--kind", "dflash2", "--depthwise-shift-mix"]}
BLOCKS = (4, 8)
DATA = ["--target", "smollm2", "--num-prompts", "384", "--max-new-tokens", "256", "--heldout-eval-prompts", "32"]
SHAPE = ["--num-hidden-layers", "2", "--target-layer-ids", "1", "14", "27", "--intermediate-size", "1536",
         "--draft-vocab-size", "0"]  # fmt: skip
LOOP = ["--batch-size", "8", "--anchors-per-seq", "8", "--seq-len", "512", "--lr", "1e-3",
        "--warmup-steps", "20", "--loss-gamma", "7", "--save-every", "50"]  # fmt: skip


def name(kind: str, block: int) -> str:
    return f"{kind}-b{block}"


def command(work: Path, kind: str, block: int, seconds: float, until: str | None = None) -> list[str]:
    out = work / "drafters" / name(kind, block)
    flags = [*ROW_FLAGS[kind], "--block-size", str(block), "--eval-blocks", str(block), "--steps", "1000000",
             "--time-budget", str(seconds), "--eval-every", "1000000"]  # fmt: skip
    tail = ["--until", until] if until else []
    return [
        sys.executable,
        "-m",
        "portable_spec.cli",
        "train",
        *DATA,
        *SHAPE,
        *LOOP,
        *flags,
        "--work-dir",
        str(work),
        "--out",
        str(out),
        *tail,
    ]


def run_all(work: Path, seconds: float, kinds, blocks, parallel: int) -> None:
    first = command(work, kinds[0], blocks[0], seconds, until="features")
    subprocess.run(first, check=True)
    pending = [(kind, block) for block in blocks for kind in kinds]
    running: list[tuple[subprocess.Popen, str]] = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    while pending or running:
        while pending and len(running) < parallel:
            kind, block = pending.pop(0)
            log = open(work / f"{name(kind, block)}.log", "a")
            running.append(
                (
                    subprocess.Popen(command(work, kind, block, seconds), stdout=log, stderr=log, env=env),
                    name(kind, block),
                )
            )
            print(f"started {name(kind, block)}", flush=True)
        time.sleep(5)
        for process, label in list(running):
            if process.poll() is not None:
                running.remove((process, label))
                print(f"{label}: exit {process.returncode}", flush=True)


def last_eval(work: Path, label: str) -> dict | None:
    path = WorkDir(work).heldout_log(label)
    if not path.is_file():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines[-1] if lines else None


def steps_done(work: Path, label: str) -> tuple[int, float, float]:
    """(steps, the mean loss of the last 10, training seconds) from the run's loss log."""
    path = WorkDir(work).loss_log(label)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    if not lines:
        return 0, float("nan"), 0.0
    tail = lines[-10:]
    return lines[-1]["step"], sum(line["loss"] for line in tail) / len(tail), lines[-1]["seconds"]


def drafter_cost(work: Path, label: str, repeats: int = 20) -> tuple[float, int]:
    """Median seconds of one propose (one pass, block drafts) after a 256-token context, on this CPU, one thread; and
    the drafter's parameter count (its own, not the target's shared embedding and head)."""
    import torch

    from portable_spec.core.real_target import resolve_target
    from portable_spec.core.target import TargetModel

    torch.set_num_threads(1)
    target = TargetModel.load(resolve_target("smollm2"))
    drafter = target.load_drafter(work / "drafters" / label)
    params = sum(p.numel() for p in drafter.parameters())
    config = drafter.config
    context_len = 256
    features = torch.randn(1, context_len, config.feature_size)
    positions = torch.arange(context_len)[None]
    with torch.no_grad():
        context = drafter.context_kv(features, positions)
        valid = torch.ones(1, context_len, dtype=torch.bool)
        times = []
        for _ in range(repeats + 3):
            start = time.perf_counter()
            drafter.propose(
                context, valid, torch.tensor([5]), torch.tensor([context_len]), config.block_size - 1, positions
            )
            times.append(time.perf_counter() - start)
    times = sorted(times[3:])
    return times[len(times) // 2], params


def table(work: Path, kinds, blocks, seconds: float) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")  # fmt: skip
    rows = ["| block | kind | steps | training s | loss (last 10) | held-out tau | acceptance per slot | drafter "
            "params | ms per pass (1 thread) |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for block in blocks:
        for kind in kinds:
            label = name(kind, block)
            found = last_eval(work, label)
            step, loss, seconds_trained = steps_done(work, label)
            if found is None:
                rows.append(f"| {block} | {kind} | {step} | {seconds_trained:.0f} | {loss} | (no evaluation) | | | |")
                continue
            per_pass, params = drafter_cost(work, label)
            tau = found["tau"][str(block)] if isinstance(found.get("tau"), dict) else found.get("tau")
            rates = found.get("acceptance_by_position", {}).get(str(block), [])
            per_slot = " / ".join("-" if rate is None else f"{rate:.2f}" for rate in rates)
            rows.append(
                f"| {block} | {kind} | {step} | {seconds_trained:.0f} | {loss:.3f} | {tau} | {per_slot} | {params / 1e6:.1f}M | "
                f"{1000 * per_pass:.1f} |"
            )
    head = (f"Equal budget: {seconds:g} s of training per run (the same batch sequence), two runs at a time, one "
            f"thread each, on {cpu}; `python scripts/equal_budget.py --seconds {seconds:g}`.")  # fmt: skip
    return head + "\n\n" + "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=900, help="Seconds of training per run.")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS))
    parser.add_argument("--blocks", nargs="+", type=int, default=list(BLOCKS))
    parser.add_argument("--parallel", type=int, default=2, help="Runs at once, one thread each.")
    parser.add_argument("--table-only", action="store_true", help="Write the table from finished runs.")
    parser.add_argument("--out", type=Path, default=None, help="Markdown file for the table (default: stdout).")
    args = parser.parse_args()
    if not args.table_only:
        run_all(args.work_dir, args.seconds, args.kinds, args.blocks, args.parallel)
    text = table(args.work_dir, args.kinds, args.blocks, args.seconds)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
