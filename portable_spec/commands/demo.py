"""portable-spec demo: the main job, on the embedded reference backend and the shipped fixtures."""

from __future__ import annotations

import argparse

import torch

from .. import fixtures
from ..evaluate import compare, format_table
from ..spec import VARIANT_KINDS
from ..target import TargetModel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=16, help="Held-out prompts to decode (max 64).")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=7, help="Draft tokens per round (block size - 1).")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--kinds", nargs="+", default=list(VARIANT_KINDS), choices=VARIANT_KINDS)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    target = TargetModel.load(fixtures.target_dir())
    drafters = {kind: target.load_drafter(fixtures.drafter_dir(kind)) for kind in args.kinds}
    prompts = fixtures.heldout_prompts()[: args.prompts]
    print(f"target: {fixtures.target_dir()} ({sum(p.numel() for p in target.model.parameters()) / 1e6:.1f}M params, "
          f"{target.config.num_hidden_layers} layers); {len(prompts)} held-out prompts, "
          f"{args.max_new_tokens} new tokens each, greedy, batch {args.batch_size}, {torch.get_num_threads()} threads")
    rows = compare(target, drafters, prompts, [args.num_draft_tokens], args.max_new_tokens, args.batch_size)
    print(format_table(rows))
    lossless = all(row.matches_autoregressive for row in rows)
    print("every speculative output equals the autoregressive output token for token: "
          + ("yes" if lossless else "NO (bug: please report)"))
    return 0 if lossless else 1
