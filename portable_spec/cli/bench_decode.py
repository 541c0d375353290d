"""`portable-spec bench decode`: tau, tokens/s and speedup for every drafter kind at several block sizes and batch
sizes, side by side in one run with plain greedy decoding (and, at batch 1, HF generate and HF prompt lookup);
writes a markdown table, JSON and plots (speedup, tau, per-position acceptance) into --out, file by file."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

import torch

from portable_spec.bench.bench_setup import TARGET_CHOICES, device_name, load_setup, param_count
from portable_spec.bench.evaluate import PLAIN, ComparisonRow, DecodeJob, compare, format_table, grid
from portable_spec.cli.devices import DTYPES, check_device
from portable_spec.core.drafter import Drafter
from portable_spec.core.matmul_layout import LayoutTable
from portable_spec.core.outputs import claim_output_dir, mark_output_dir, results_json, write_file_atomically
from portable_spec.core.spec import VARIANT_KINDS, SpecError

BLOCK_SIZES = (4, 8, 16)
BENCH_FILES = ("benchmarks.md", "benchmarks.json", "benchmarks.png")


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", choices=TARGET_CHOICES, default="smollm2")
    parser.add_argument("--prompts", type=int, default=64, help="Held-out prompts.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=list(BLOCK_SIZES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="Default: 1 4 (decode), 1 8 (vllm).")
    parser.add_argument(
        "--draft-confidence",
        type=float,
        default=0.3,
        help="Also run every drafter at the largest block with rounds cut to the draft prefix it is "
        "this confident in; 0 skips those rows.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="Directory for benchmarks.md/.json/.png (only those files are written or replaced).",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="Replace result files (benchmarks.*, vllm.*) in --out that portable-spec did not write.",
    )
    parser.add_argument("--device", default="cpu", help="Where the target and drafters run (cpu, cuda, cuda:N).")
    parser.add_argument(
        "--dtype",
        choices=tuple(DTYPES),
        default="float32",
        help="Target and drafter dtype (decode and vllm; float32 = the reference's). In 16 bits a k+1-token verify "
        "pass may round differently from a one-token pass: the lossless column says whether outputs stayed equal.",
    )
    parser.add_argument(
        "--drafter",
        action="append",
        default=None,
        metavar="NAME=DIR",
        help="Benchmark this drafter checkpoint as row NAME (repeat); replaces the shipped drafters.",
    )


def plot(rows: list[ComparisonRow], path: Path, device: str = "cpu") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r.batch_size for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for batch in batches:
        for kind in sorted({r.drafter for r in rows if r.drafter_params and not r.draft_lengths}):
            mine = [r for r in rows if r.drafter == kind and r.batch_size == batch]
            blocks = [r.num_draft_tokens + 1 for r in mine]
            style = "-" if batch == 1 else "--"
            axes[0].plot(blocks, [r.speedup for r in mine], style, marker="o", label=f"{kind}, batch {batch}")
            if batch == batches[0]:
                axes[1].plot(blocks, [r.acceptance_length for r in mine], marker="o", label=kind)
                longest = max(mine, key=lambda r: r.num_draft_tokens)
                if longest.acceptance_by_position:  # rows cut by confidence have no per-position curve
                    axes[2].plot(
                        range(1, longest.num_draft_tokens + 1),
                        longest.acceptance_by_position,
                        marker=".",
                        label=f"{kind} (block {longest.num_draft_tokens + 1})",
                    )
    for baseline in [r for r in rows if not r.drafter_params and r.batch_size == 1 and r.speedup != 1.0]:
        axes[0].axhline(baseline.speedup, linestyle=":", linewidth=1, color="black")
        axes[0].annotate(
            baseline.drafter,
            (min(r.num_draft_tokens + 1 for r in rows if r.drafter_params), baseline.speedup),
            fontsize=7,
        )
    axes[0].axhline(1.0, color="grey", linewidth=0.8)
    axes[0].set(
        xlabel="block size (anchor + drafts)", ylabel="tokens/s vs plain greedy", title=f"speedup ({device.upper()})"
    )
    axes[1].set(xlabel="block size", ylabel="tau", title=f"acceptance length, batch {batches[0]}")
    axes[2].set(
        xlabel="draft slot i", ylabel="P(slot i accepted | slots < i accepted)", title="per-position acceptance"
    )
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def layout_jobs(drafters: dict[str, Drafter], num_drafts: int) -> list[DecodeJob]:
    """Rows that show what measuring the matmul layout (core/matmul_layout.py) is worth: plain greedy and the
    shift-mix drafter (depth_causal) with torch's own F.linear everywhere, and with the W @ x^T rule for 2-8 rows
    this project hard-coded before, in the same run as the measured rows."""
    jobs = []
    for layout, suffix in (("linear", " (torch F.linear)"), ("fixed", " (fixed W@x^T, 2-8 rows)")):
        jobs.append(DecodeJob(PLAIN.split(" (")[0] + suffix, None, 0, matmul_layout=layout))
        jobs += [
            DecodeJob(kind + suffix, drafter, num_drafts, matmul_layout=layout)
            for kind, drafter in drafters.items()
            if drafter.behaviour.shift_mix
        ]  # the method this project ports
    return jobs


def _check_args(args: argparse.Namespace) -> None:
    for name in ("prompts", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise SpecError(f"--{name.replace('_', '-')}={getattr(args, name)}: must be at least 1")
    if not 0 <= args.draft_confidence < 1:
        raise SpecError(
            f"--draft-confidence={args.draft_confidence}: use a probability in [0, 1); 0 skips the cut rows"
        )
    for block in args.block_sizes:
        if block < 2:
            raise SpecError(f"--block-sizes {block}: a block needs the anchor and at least one draft (>= 2)")
    for batch in args.batch_sizes:
        if batch < 1:
            raise SpecError(f"--batch-sizes {batch}: must be at least 1")
    if args.out is not None:
        claim_output_dir(args.out, "bench", BENCH_FILES, force=args.force, inputs=bench_inputs(args))
    check_device(args.device)
    seen: dict[str, str] = {}
    for spec in args.drafter or []:
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).is_dir():
            raise SpecError(f"--drafter {spec!r}: give NAME=DIR with DIR a drafter checkpoint directory")
        if name in seen:
            raise SpecError(
                f"--drafter {spec!r}: the row name {name!r} is already --drafter {seen[name]!r}; give each row its "
                "own NAME"
            )
        seen[name] = spec


def bench_inputs(args: argparse.Namespace) -> tuple[Path, ...]:
    """What a benchmark reads: the target's directory and every drafter checkpoint (no --out may touch them)."""
    from portable_spec.core import fixtures, real_assets
    from portable_spec.core.real_target import converted_dir

    if args.target == "fixture":
        target, shipped, kinds = fixtures.target_dir(), fixtures.drafter_dir, VARIANT_KINDS
    else:
        target, shipped, kinds = converted_dir(args.target), real_assets.drafter_dir, real_assets.SHIPPED_KINDS
    drafters = _drafter_dirs(args) or {kind: shipped(kind) for kind in kinds}
    return (target, *drafters.values())


def _check_block_sizes(args: argparse.Namespace) -> None:
    """--block-sizes within every benchmarked drafter's block (read from the checkpoints, before any model loads)."""
    from portable_spec.core import fixtures, real_assets
    from portable_spec.core.spec import read_config

    fixture = args.target == "fixture"
    shipped = fixtures.drafter_dir if fixture else real_assets.drafter_dir
    kinds = VARIANT_KINDS if fixture else real_assets.SHIPPED_KINDS
    dirs = _drafter_dirs(args) or {kind: shipped(kind) for kind in kinds}
    blocks = {name: read_config(path).block_size for name, path in dirs.items()}
    smallest = min(blocks.values())
    for block in args.block_sizes:
        if block > smallest:
            raise SpecError(
                f"--block-sizes {block}: larger than the block the drafters were trained with "
                f"({', '.join(f'{n}: {b}' for n, b in blocks.items())}); use 2..{smallest}"
            )


def _drafter_dirs(args: argparse.Namespace) -> dict[str, Path] | None:
    return {spec.partition("=")[0]: Path(spec.partition("=")[2]) for spec in args.drafter} if args.drafter else None


def run_decode_bench(args: argparse.Namespace) -> int:
    _check_args(args)
    _check_block_sizes(args)
    torch.manual_seed(0)
    setup = load_setup(args.target, device=args.device, drafter_dirs=_drafter_dirs(args), dtype=DTYPES[args.dtype])
    prompts = setup.prompts[: args.prompts]
    rows: list[ComparisonRow] = []
    notes: list[str] = []
    jobs = grid(setup.drafters, [b - 1 for b in args.block_sizes])
    jobs += grid(setup.drafters, [max(args.block_sizes) - 1], draft_length="adaptive")  # the default path
    if args.draft_confidence:
        jobs += grid(setup.drafters, [max(args.block_sizes) - 1], args.draft_confidence)
    on_cpu = setup.target.device.type == "cpu"  # the F.linear layout rows measure a CPU-only layout
    for batch in args.batch_sizes:
        layout = layout_jobs(setup.drafters, min(args.block_sizes) - 1) if batch == 1 and on_cpu else []
        comparison = compare(
            setup.target,
            jobs + layout,
            prompts,
            args.max_new_tokens,
            batch,
            stop_token_ids=setup.stop_token_ids,
            hf_baselines=batch == 1,
        )
        rows += comparison.rows
        notes.append(f"batch {batch}: {comparison.timing_note()}")
    header = (
        f"{setup.describe}, {param_count(setup.target):.1f}M params: {len(prompts)} prompts x up to "
        f"{args.max_new_tokens} new tokens, greedy, batch sizes {args.batch_sizes}, "
        f"{device_name(setup.target.device)}, {args.dtype}; all rows measured in one "
        "run, interleaved prompt by prompt after an untimed warm-up of every row (bench/evaluate.py). Rows run the "
        "matmul layout measured on this machine unless named otherwise; '(adaptive k)' rows choose each round's "
        "draft count (0 = plain) from measured costs and acceptance, up to the largest block."
    )
    notes.append(LayoutTable.load(setup.target.device).summary())
    notes += [f"{r.drafter}, batch {r.batch_size}: {r.draft_lengths}" for r in rows if r.draft_lengths]
    table = format_table(rows)
    positions = "\n".join(
        f"| {r.drafter} | {r.num_draft_tokens + 1} | " + " ".join(f"{p:.2f}" for p in r.acceptance_by_position) + " |"
        for r in rows
        if r.drafter_params and r.batch_size == args.batch_sizes[0] and r.acceptance_by_position
    )
    print(header)
    print(table)
    print("\n".join(notes))
    if args.out is not None:
        mark_output_dir(args.out, "bench", BENCH_FILES)
        data = [asdict(r) for r in rows]
        write_file_atomically(args.out / "benchmarks.json", lambda p: p.write_text(results_json(data, indent=1)))
        write_file_atomically(
            args.out / "benchmarks.md",
            lambda p: p.write_text(
                f"{header}\n\n{table}\n\n"
                + "\n".join(f"- {note}" for note in notes)
                + "\n\nPer-position acceptance, P(slot i accepted | slots < i accepted), "
                f"batch {args.batch_sizes[0]}:\n\n| drafter | block | slot 1 .. k-1 |\n|---|---|---|\n{positions}\n"
            ),
        )
        write_file_atomically(args.out / "benchmarks.png", lambda p: plot(rows, p, setup.target.device.type))
        print(f"wrote {args.out}/benchmarks.md, .json, .png")
    return 0 if all(r.matches_plain_greedy for r in rows if r.drafter_params) else 1
