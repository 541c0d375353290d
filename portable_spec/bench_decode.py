"""`portable-spec bench decode`: tau and speedup for every drafter kind at block sizes 4, 8, 16, side by side in
one run on the held-out prompts; writes a markdown table and a plot (docs/benchmarks.md, docs/benchmarks.png)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from . import fixtures
from .checkpoint import write_dir_atomically
from .evaluate import ComparisonRow, compare, format_table
from .spec import VARIANT_KINDS
from .target import TargetModel

BLOCK_SIZES = (4, 8, 16)


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=64, help="Held-out prompts (max 64).")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=list(BLOCK_SIZES))
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="Directory for benchmarks.md/.json/.png.")


def plot(rows: list[ComparisonRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind in sorted({r.drafter for r in rows if r.num_draft_tokens}):
        mine = [r for r in rows if r.drafter == kind]
        blocks = [r.num_draft_tokens + 1 for r in mine]
        axes[0].plot(blocks, [r.acceptance_length for r in mine], marker="o", label=kind)
        axes[1].plot(blocks, [r.speedup for r in mine], marker="o", label=kind)
    axes[0].set(xlabel="block size (anchor + drafts)", ylabel="acceptance length tau", title="tau (higher is better)")
    axes[1].set(xlabel="block size (anchor + drafts)", ylabel="tokens/s vs autoregressive", title="speedup, CPU reference")
    axes[1].axhline(1.0, color="grey", linewidth=0.8)
    for ax in axes:
        ax.set_xticks(sorted({r.num_draft_tokens + 1 for r in rows if r.num_draft_tokens}))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_decode_bench(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    target = TargetModel.load(fixtures.target_dir())
    drafters = {kind: target.load_drafter(fixtures.drafter_dir(kind)) for kind in VARIANT_KINDS}
    prompts = fixtures.heldout_prompts()[: args.prompts]
    rows = compare(target, drafters, prompts, [b - 1 for b in args.block_sizes], args.max_new_tokens, args.batch_size)
    header = (f"{len(prompts)} held-out prompts x {args.max_new_tokens} new tokens, greedy, batch {args.batch_size}, "
              f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}; all rows measured in one run.")
    table = format_table(rows)
    print(header)
    print(table)
    if args.out is not None:
        def write(tmp: Path) -> None:
            (tmp / "benchmarks.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
            (tmp / "benchmarks.md").write_text(f"{header}\n\n{table}\n")
            plot(rows, tmp / "benchmarks.png")
        write_dir_atomically(args.out, write)
        print(f"wrote {args.out}/benchmarks.md, .json, .png")
    return 0 if all(r.matches_autoregressive for r in rows) else 1
