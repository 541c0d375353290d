"""`portable-spec bench llamacpp`: the CPU picture a llama.cpp user sees, side by side in one run.

Rows, each request timed from prompt to last token (model loading excluded), interleaved prompt by prompt so that
load on the machine falls on every row alike:
- llama.cpp plain greedy on the user's quantized target (the shipped Q4_1 GGUF: what a CPU user runs; the baseline)
  and on the F32 conversion (the reference's exact weights);
- llama.cpp `draft-dflash` with every exportable shipped drafter (`export gguf`) at each --n-max on the quantized
  target, and at the --n-max nearest 3 and the trained block on F32. llama.cpp always runs an (n_max + 1)-slot block, so
  below n_max = block_size - 1 a bidirectional (parallel) drafter runs on a shorter block than it was trained on;
  the reference runs the whole trained block and takes the first drafts;
- llama.cpp's own ngram modes (no drafter) at the largest --n-max;
- portable-spec's reference loop (fp32 torch): plain, and each shipped drafter at block 4 (fixed and adaptive).
Speed-ups are ratios of summed tokens over summed seconds against the baseline, with the spread of per-prompt
ratios (median, quartiles). tau = 1 + accepted drafts / rounds. `break-even tau`: the tau at which a row's round
would cost no more per token than the baseline's plain step (round seconds / plain seconds per token). Lossless:
prompts whose tokens equal the same weights' plain greedy (llama.cpp rows) or the reference's plain (reference).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from portable_spec.adapters.llamacpp import build, engine
from portable_spec.adapters.llamacpp.gguf_export import DRAFTER_FILE, export_gguf
from portable_spec.core.matmul_layout import cpu_description
from portable_spec.core.outputs import claim_output_dir, mark_output_dir, results_json, write_file_atomically
from portable_spec.core.spec import SpecError, read_config

NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-mod")
RESULT_FILES = ("llamacpp.md", "llamacpp.json")
KIND = "bench"  # one kind for every bench writing into a results folder (decode, vllm, llamacpp)


@dataclass
class Row:
    name: str
    engine: str  # "llama.cpp" | "reference"
    weights: str  # "Q4_1" | "F32" | "fp32 torch"
    tokens: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    rounds: int = 0
    accepted: int = 0
    lossless: int = 0
    every_round_drafts: bool = False  # a fixed draft length: its break-even tau is defined

    @property
    def tokens_per_second(self) -> float:
        return sum(map(len, self.tokens)) / max(sum(self.seconds), 1e-9)

    @property
    def tau(self) -> float | None:
        return None if self.rounds == 0 else 1 + self.accepted / self.rounds


def _stops(tokens: list[int], stop: int) -> list[int]:
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


def run_llamacpp_bench(args) -> int:
    """`args`: prompts, max_new_tokens, n_max (list), threads, out, force."""
    from portable_spec.core import real_assets
    from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
    from portable_spec.core.real_target import KNOWN_TARGETS, fetch_target, gguf_path
    from portable_spec.core.target import TargetModel

    reason = build.missing()
    if reason is not None:
        raise SpecError(f"bench llamacpp: {reason}")
    if args.out is not None:
        claim_output_dir(args.out, KIND, RESULT_FILES, force=args.force)
    target_dir = fetch_target("smollm2")
    work = build.home() / "bench"
    q4 = gguf_path(KNOWN_TARGETS["smollm2"])
    f32 = engine.convert_target(target_dir, build.home() / "targets" / "smollm2-f32.gguf")
    targets = {"Q4_1": q4, "F32": f32}
    drafters = {"parallel": real_assets.drafter_dir("parallel")}
    drafts = {}
    for kind, path in drafters.items():
        for weights, gguf in targets.items():
            out = work / f"{kind}-{weights}"
            if not (out / DRAFTER_FILE).is_file():
                export_gguf(path, out, gguf, target_dir, force=True)
            drafts[kind, weights] = out / DRAFTER_FILE

    rows: dict[str, Row] = {}
    jobs = []  # (row, callable(prompt) -> (tokens, seconds, rounds, accepted))

    def harness_job(name, weights, draft=None, spec_type=None, n_max=None):
        rows[name] = Row(name, "llama.cpp", weights, every_round_drafts=draft is not None)

        def run(prompt):
            result = engine.run_harness(
                targets[weights], prompt, args.max_new_tokens, draft, spec_type, n_max, threads=args.threads
            )
            rounds = sum(1 for drafted in result.drafts if drafted)  # ngram modes may propose nothing
            return result.tokens, result.prefill_seconds + result.decode_seconds, rounds, sum(result.accepted)

        jobs.append((name, run))

    for weights in targets:
        harness_job(f"llama.cpp plain ({weights})", weights)
    full_block = {kind: read_config(path).block_size - 1 for kind, path in drafters.items()}
    for (kind, weights), draft in drafts.items():
        on_f32 = {min(args.n_max, key=lambda n: abs(n - 3)), full_block[kind]}  # ~3 drafts, and the trained block
        for n_max in args.n_max if weights == "Q4_1" else sorted(on_f32):
            harness_job(f"llama.cpp draft-dflash {kind} n_max={n_max} ({weights})", weights, draft, n_max=n_max)
    for mode in NGRAM_MODES:
        harness_job(f"llama.cpp {mode} n_max={max(args.n_max)} (Q4_1)", "Q4_1", spec_type=mode, n_max=max(args.n_max))

    torch.set_num_threads(args.threads)
    target = TargetModel.load(target_dir, tokenizer=True)
    stop = target.tokenizer.eos_token_id
    reference = {
        "reference plain (fp32 torch)": None,
        **{f"reference {kind} k=3 fixed (fp32 torch)": (kind, "fixed") for kind in ("parallel", "depth_causal")},
        **{f"reference {kind} k=3 adaptive (fp32 torch)": (kind, "adaptive") for kind in ("parallel", "depth_causal")},
    }
    loaded = {kind: target.load_drafter(real_assets.drafter_dir(kind)) for kind in ("parallel", "depth_causal")}
    for name, spec in reference.items():
        rows[name] = Row(name, "reference", "fp32 torch", every_round_drafts=spec is not None and spec[1] == "fixed")
        decoder = SpeculativeDecoder(target, None if spec is None else loaded[spec[0]])
        config = GenerationConfig(
            max_new_tokens=args.max_new_tokens,
            num_draft_tokens=3,
            stop_token_ids=(stop,),
            draft_length="fixed" if spec is None else spec[1],
        )

        def run(prompt, decoder=decoder, config=config, speculative=spec is not None):
            start = time.perf_counter()
            output = decoder.generate([prompt], config)
            seconds = time.perf_counter() - start
            by_round = output.stats.accepted_by_request[0] if speculative else []
            return output.tokens[0], seconds, len(by_round), sum(by_round)

        jobs.append((name, run))

    prompts = real_assets.heldout_prompts()[: args.prompts]
    for p, prompt in enumerate(prompts):
        order = jobs[p % len(jobs) :] + jobs[: p % len(jobs)]  # rotate: no row always runs first or last
        for name, run in order:
            tokens, seconds, rounds, accepted = run(prompt)
            row = rows[name]
            row.tokens.append(_stops(tokens, stop))
            row.seconds.append(seconds)
            row.rounds += rounds
            row.accepted += accepted
        print(f"prompt {p + 1}/{len(prompts)} done", flush=True)

    plain_of = {"Q4_1": rows["llama.cpp plain (Q4_1)"], "F32": rows["llama.cpp plain (F32)"]}
    plain_of["fp32 torch"] = rows["reference plain (fp32 torch)"]
    baseline = plain_of["Q4_1"]
    for row in rows.values():
        plain = plain_of[row.weights]
        row.lossless = sum(a == b for a, b in zip(row.tokens, plain.tokens))
    table = _table(rows, baseline, plain_of, args, len(prompts))
    print(table)
    if args.out is not None:
        out = Path(args.out)
        payload = {
            "machine": cpu_description(),
            "prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "threads": args.threads,
            "llamacpp": build.BUILD,
            "rows": [
                asdict(row) | {"tokens_per_second": row.tokens_per_second, "tau": row.tau} for row in rows.values()
            ],
        }
        write_file_atomically(out / "llamacpp.json", lambda tmp: tmp.write_text(results_json(payload)))
        write_file_atomically(out / "llamacpp.md", lambda tmp: tmp.write_text(table))
        mark_output_dir(out, KIND, RESULT_FILES)
    return 0


def _table(rows: dict[str, Row], baseline: Row, plain_of: dict[str, Row], args, prompts: int) -> str:
    lines = [
        f"Machine: {cpu_description()}, {args.threads} threads; llama.cpp {build.BUILD}; SmolLM2-135M-Instruct, "
        f"{prompts} held-out prompts x up to {args.max_new_tokens} tokens, greedy, batch 1, stop at <|im_end|>.",
        "",
        "| row | tokens/s | vs llama.cpp plain Q4_1 | per-prompt ratio median [q1, q3] | tau | break-even tau | lossless |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for row in rows.values():
        ratios = [
            (len(t) / s) / (len(bt) / bs)
            for t, s, bt, bs in zip(row.tokens, row.seconds, baseline.tokens, baseline.seconds)
            if s > 0 and bs > 0 and bt
        ]
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
        plain = plain_of[row.weights]
        plain_step = sum(plain.seconds) / max(sum(map(len, plain.tokens)), 1)
        break_even = (
            f"{(sum(row.seconds) / row.rounds) / plain_step:.2f}" if row.every_round_drafts and row.rounds else ""
        )  # a round's cost in plain steps (prefill spread over the rounds, as over the plain tokens)
        lines.append(
            f"| {row.name} | {row.tokens_per_second:.1f} | {row.tokens_per_second / baseline.tokens_per_second:.2f}x "
            f"| {q[1]:.2f} [{q[0]:.2f}, {q[2]:.2f}] | {'' if row.tau is None else f'{row.tau:.3f}'} | {break_even} "
            f"| {row.lossless}/{len(row.tokens)} |"
        )
    return "\n".join(lines) + "\n"
