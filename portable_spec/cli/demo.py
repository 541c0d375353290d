"""portable-spec demo: the main job. Speculative decoding on the embedded reference backend with the shipped
drafters, side by side in one run with plain greedy decoding, HF `generate` and HF prompt lookup."""

from __future__ import annotations

import argparse

import torch

from portable_spec.bench.bench_setup import TARGET_CHOICES, device_name, load_setup, param_count
from portable_spec.bench.evaluate import compare, format_table, grid
from portable_spec.core.matmul_layout import LayoutTable
from portable_spec.core.real_assets import SHIPPED_KINDS
from portable_spec.core.spec import SpecError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        choices=TARGET_CHOICES,
        default="smollm2",
        help="smollm2: the real target (converted on first use); fixture: the tiny test models.",
    )
    parser.add_argument(
        "--prompts", type=int, default=8, help="Held-out prompts to decode (speedups are medians over them)."
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="Draft tokens per round, the most with --draft-length adaptive (default: what the benchmark found best "
        "on each target).",
    )
    parser.add_argument(
        "--draft-length",
        choices=("adaptive", "fixed"),
        default="adaptive",
        help="adaptive (default): each round verifies the draft count (0 = plain decoding) with the most expected "
        "tokens per second from this machine's measured costs and the measured acceptance; fixed: "
        "--num-draft-tokens every round.",
    )
    parser.add_argument(
        "--draft-confidence",
        type=float,
        default=None,
        help="Also run each drafter verifying only the draft prefix it is this confident in "
        "(product of its probabilities); off by default.",
    )
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument(
        "--kinds", nargs="+", default=None, choices=SHIPPED_KINDS, help="Default: every shipped drafter's kind."
    )
    parser.add_argument("--no-hf", action="store_true", help="Skip the HF generate / prompt-lookup rows.")


def run(args: argparse.Namespace) -> int:
    for name in ("prompts", "max_new_tokens", "batch_size"):
        if getattr(args, name) < 1:
            raise SpecError(f"--{name.replace('_', '-')}={getattr(args, name)}: must be at least 1")
    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        raise SpecError(f"--num-draft-tokens={args.num_draft_tokens}: must be at least 1 (omit it for the default)")
    if args.draft_confidence is not None and not 0 <= args.draft_confidence < 1:
        raise SpecError(f"--draft-confidence={args.draft_confidence}: use a probability in [0, 1); 0 turns the cut off")
    torch.manual_seed(0)
    setup = load_setup(args.target, args.kinds)
    num_drafts = setup.default_num_drafts if args.num_draft_tokens is None else args.num_draft_tokens
    prompts = setup.prompts[: args.prompts]
    print(
        f"target: {setup.describe}, {param_count(setup.target):.1f}M params; {len(prompts)} prompts, "
        f"up to {args.max_new_tokens} new tokens each, greedy, batch {args.batch_size}, "
        f"{device_name(setup.target.device)}"
    )
    confidence = args.draft_confidence if args.draft_confidence is not None else setup.default_confidence
    jobs = grid(setup.drafters, [num_drafts], draft_length=args.draft_length)
    jobs += grid(setup.drafters, [num_drafts], confidence) if confidence else []
    comparison = compare(
        setup.target,
        jobs,
        prompts,
        args.max_new_tokens,
        args.batch_size,
        stop_token_ids=setup.stop_token_ids,
        hf_baselines=not args.no_hf and args.batch_size == 1,
    )
    print(format_table(comparison.rows))
    print(comparison.timing_note())
    print(LayoutTable.load(setup.target.device).summary())
    for row in comparison.rows:
        if row.draft_lengths:
            print(f"{row.drafter}: {row.draft_lengths}")
    lossless = all(row.matches_plain_greedy for row in comparison.rows if row.drafter_params)
    print(
        "every speculative output equals plain greedy output token for token: "
        + ("yes" if lossless else "NO (bug: please report)")
    )
    return 0 if lossless else 1
