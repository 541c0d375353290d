"""Side-by-side runs of the reference loop: each drafter kind against plain greedy decoding of the same loop and,
optionally, what a user would otherwise run (HF `generate`, HF prompt lookup).

Timing that holds on a shared machine: every method is first run untimed (kernel compiles, caches, first calls),
then all methods are timed on one prompt (one batch) before the next, in an order rotated per prompt, with plain
greedy decoding both first and last on every prompt. A method's speedup is the median over prompts of (plain time /
method time on that prompt), printed with its spread: load that comes and goes lands on one prompt's cells, not on a
whole row. Where plain decoding's two timings of the same prompt disagree (median over prompts) by more than
NOISE_THRESHOLD, the load changed within single prompts and the table says its timings are unreliable; tau and
passes per token do not depend on timing and stand either way. Used by `portable-spec demo` and `bench decode`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from portable_spec.bench.baselines import hf_generate, hf_name
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder, acceptance_by_position, synchronize
from portable_spec.core.drafter import Drafter
from portable_spec.core.matmul_layout import LayoutTable
from portable_spec.core.target import TargetModel

PLAIN = "plain greedy (same loop, no drafter)"
NOISE_THRESHOLD = 0.10  # plain decoding's two timings of a prompt may differ by this much (median) before we warn
WARMUP_TOKENS = 8  # new tokens of each method's untimed warm-up run


MATMUL_LAYOUTS = ("measured", "linear", "fixed")  # this machine's measured choice; torch's F.linear; W@x^T at 2-8 rows


def layout_table(name: str, device) -> LayoutTable | None:
    """A DecodeJob's matmul layout: measured on this machine (cached), torch's own everywhere (None), or the fixed
    rule this project used before it measured (W @ x^T for 2-8 rows), kept to show what measuring is worth."""
    if name == "measured":
        return LayoutTable.load(device)
    if name == "fixed":
        return LayoutTable.fixed("transposed", range(2, 9))
    return None


@dataclass(frozen=True)
class DecodeJob:
    """One row of a comparison: a drafter (None = plain greedy), its draft tokens per round (the most, with
    draft_length "adaptive"), confidence cut and matmul layout."""

    name: str
    drafter: Drafter | None
    num_draft_tokens: int
    draft_confidence: float = 0.0
    matmul_layout: str = "measured"  # MATMUL_LAYOUTS
    draft_length: str = "fixed"  # GenerationConfig.draft_length


def grid(
    drafters: dict[str, Drafter],
    num_draft_tokens: list[int],
    draft_confidence: float = 0.0,
    draft_length: str = "fixed",
) -> list[DecodeJob]:
    suffix = f" (cut < {draft_confidence:g})" if draft_confidence else ""
    suffix += " (adaptive k)" if draft_length == "adaptive" else ""
    return [
        DecodeJob(name + suffix, drafter, n, draft_confidence, draft_length=draft_length)
        for name, drafter in drafters.items()
        for n in num_draft_tokens
    ]


@dataclass
class ComparisonRow:
    drafter: str
    num_draft_tokens: int
    acceptance_length: float  # tau: tokens emitted per verification round (nan where the baseline hides it)
    target_passes_per_token: float
    drafter_passes_per_token: float
    tokens_per_second: float  # median over prompts of tokens / seconds on that prompt
    speedup: float  # median over prompts of (plain time / this method's time) on that prompt
    matches_plain_greedy: bool  # output equals plain greedy output token for token
    drafter_params: int = 0
    batch_size: int = 1
    # P(draft slot i accepted | slots < i accepted), i = 1..num_draft_tokens
    acceptance_by_position: list[float] = field(default_factory=list)
    drafts_verified_per_round: float = 0.0  # < num_draft_tokens when rounds are cut by confidence
    speedup_spread: tuple[float, float] = (math.nan, math.nan)  # quartiles over prompts (min-max under 4 prompts)
    speedup_per_prompt: list[float] = field(default_factory=list)
    tokens_per_second_total: float = math.nan  # all prompts' tokens over all their timed seconds (load-sensitive)
    draft_lengths: str = ""  # adaptive rows: how the draft length was chosen (DraftLengthPolicy.summary)


@dataclass
class Comparison:
    rows: list[ComparisonRow]
    plain_drift: float  # median over prompts of |plain's second time / its first - 1|
    plain_drift_max: float
    prompts: int

    @property
    def reliable(self) -> bool:
        return self.plain_drift <= NOISE_THRESHOLD

    def timing_note(self) -> str:
        """One line on how far the timings can be trusted (the tau columns do not depend on them)."""
        measured = (
            f"plain decoding timed first and last on each of {self.prompts} prompts: its two timings differ by "
            f"{self.plain_drift:.0%} (median; max {self.plain_drift_max:.0%})"
        )
        if self.reliable:
            return f"timings: {measured}; speedups are medians over prompts with their spread"
        return (
            f"timings UNRELIABLE: {measured}, over the {NOISE_THRESHOLD:.0%} this table allows: the machine's load "
            "changed while it ran, so tokens/s and speedups may be off by that much (tau and passes/token stand)"
        )


@dataclass
class _Totals:
    """One method's decode statistics and timings, unit by unit."""

    tokens: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # per unit
    rounds: int = 0
    drafter_passes: int = 0
    emitted_per_round: list[int] = field(default_factory=list)
    drafts_verified: int = 0


@dataclass
class _Method:
    """One row: `run(unit, max_new_tokens) -> (tokens, DecodeStats | None)` decodes one batch of prompts."""

    name: str
    run: Callable
    job: DecodeJob | None = None  # None: an HF baseline
    lookup: int | None = None
    totals: _Totals = field(default_factory=_Totals)
    decoder: SpeculativeDecoder | None = None


def _decoder_method(target: TargetModel, job: DecodeJob, base: GenerationConfig, tables: dict) -> _Method:
    """tables: one LayoutTable per layout name for the whole comparison, so a product is timed once."""
    if job.matmul_layout not in tables:
        tables[job.matmul_layout] = layout_table(job.matmul_layout, target.device)
    decoder = SpeculativeDecoder(target, job.drafter, tables[job.matmul_layout])
    config = base.model_copy(
        update={
            "num_draft_tokens": max(job.num_draft_tokens, 1),
            "draft_confidence": job.draft_confidence,
            "draft_length": job.draft_length,
        }
    )

    def run(unit, max_new_tokens):
        with torch.inference_mode():
            out = decoder.generate(unit, config.model_copy(update={"max_new_tokens": max_new_tokens}))
        return out.tokens, out.stats

    return _Method(job.name, run, job, decoder=decoder)


def _hf_method(target: TargetModel, lookup: int | None, stop_token_ids: tuple[int, ...]) -> _Method:
    def run(unit, max_new_tokens):
        return [hf_generate(target, prompt, max_new_tokens, stop_token_ids, lookup) for prompt in unit], None

    return _Method(hf_name(lookup), run, lookup=lookup)


def compare(
    target: TargetModel,
    jobs: list[DecodeJob],
    prompts: list[list[int]],
    max_new_tokens: int = 64,
    batch_size: int = 1,
    progress: bool = True,
    stop_token_ids: tuple[int, ...] = (),
    hf_baselines: bool = False,
    prompt_lookup_num_tokens: int = 10,
    clock: Callable[[], float] = time.perf_counter,
) -> Comparison:
    """Plain greedy decoding (the reference output), every job and, at batch 1, the HF baselines, warmed up and then
    timed interleaved unit by unit (a unit: batch_size prompts); `clock` is the timer (a test injects a fake one)."""
    base = GenerationConfig(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
    tables: dict[str, LayoutTable | None] = {}
    plain = _decoder_method(target, DecodeJob(PLAIN, None, 0), base, tables)
    others = [_decoder_method(target, job, base, tables) for job in jobs]
    if hf_baselines and batch_size == 1:
        others += [_hf_method(target, lookup, stop_token_ids) for lookup in (None, prompt_lookup_num_tokens)]
    units = [prompts[start : start + batch_size] for start in range(0, len(prompts), batch_size)]
    for method in [plain, *others]:  # untimed: compiles, caches and first calls stay out of every timed cell
        method.run(units[0], min(max_new_tokens, WARMUP_TOKENS))
    second_plain: list[float] = []
    bar = tqdm(total=len(units) * (len(others) + 2), desc="decode (interleaved)", disable=not progress)
    for index, unit in enumerate(units):
        turn = index % len(others) if others else 0
        order = [plain, *others[turn:], *others[:turn]]
        for method in order:
            _timed(target, method, unit, max_new_tokens, clock)
            bar.update()
        _timed_run(target, plain, unit, max_new_tokens, clock, second_plain)
        bar.update()
    bar.close()
    plain_seconds = [(a + b) / 2 for a, b in zip(plain.totals.seconds, second_plain)]
    drift = [abs(b / a - 1) if a > 0 else 0.0 for a, b in zip(plain.totals.seconds, second_plain)]
    plain.totals.seconds = plain_seconds
    reference = plain.totals.tokens
    rows = [_row(method, plain_seconds, reference, batch_size, len(prompts)) for method in [plain, *others]]
    return Comparison(rows, float(np.median(drift)), float(max(drift)), len(units))


def _timed(target: TargetModel, method: _Method, unit, max_new_tokens: int, clock) -> None:
    tokens, stats = _timed_run(target, method, unit, max_new_tokens, clock, method.totals.seconds)
    totals = method.totals
    totals.tokens += tokens
    if stats is not None:
        totals.rounds += stats.rounds
        totals.drafter_passes += stats.drafter_passes
        totals.emitted_per_round += stats.emitted_per_round
        totals.drafts_verified += stats.drafts_verified


def _timed_run(target: TargetModel, method: _Method, unit, max_new_tokens: int, clock, seconds: list[float]):
    synchronize(target.device)
    began = clock()
    tokens, stats = method.run(unit, max_new_tokens)
    synchronize(target.device)
    seconds.append(clock() - began)
    return tokens, stats


def _row(method: _Method, plain_seconds: list[float], reference, batch_size: int, num_prompts: int) -> ComparisonRow:
    totals, job = method.totals, method.job
    ratios = [p / m if m > 0 else math.nan for p, m in zip(plain_seconds, totals.seconds)]
    low, high = np.percentile(ratios, [25, 75]) if len(ratios) >= 4 else (min(ratios), max(ratios))
    generated = sum(len(t) for t in totals.tokens)
    emitted = totals.emitted_per_round
    per_unit_tokens = [
        sum(len(t) for t in totals.tokens[i : i + batch_size]) for i in range(0, len(totals.tokens), batch_size)
    ]
    common = dict(
        tokens_per_second=float(
            np.median([n / s if s > 0 else math.nan for n, s in zip(per_unit_tokens, totals.seconds)])
        ),
        tokens_per_second_total=generated / sum(totals.seconds) if sum(totals.seconds) > 0 else math.nan,
        speedup=float(np.median(ratios)),
        speedup_spread=(float(low), float(high)),
        speedup_per_prompt=[round(r, 4) for r in ratios],
        matches_plain_greedy=totals.tokens == reference,
        batch_size=batch_size,
    )
    if job is None:  # an HF baseline: its rounds are hidden inside generate
        lookup = method.lookup
        return ComparisonRow(
            drafter=method.name,
            num_draft_tokens=lookup or 0,
            acceptance_length=1.0 if lookup is None else math.nan,
            target_passes_per_token=1.0 if lookup is None else math.nan,
            drafter_passes_per_token=0.0,
            **common,
        )
    n = job.num_draft_tokens
    policies = method.decoder.policies.values() if method.decoder is not None else []
    per_position = n and not job.draft_confidence and job.draft_length == "fixed"  # else slots go unverified
    return ComparisonRow(
        drafter=job.name,
        num_draft_tokens=n,
        acceptance_length=sum(emitted) / len(emitted) if emitted else math.nan,  # no round: prefill only
        target_passes_per_token=(totals.rounds + num_prompts) / generated,
        drafter_passes_per_token=totals.drafter_passes / generated,
        drafter_params=sum(p.numel() for p in job.drafter.parameters()) if job.drafter is not None else 0,
        acceptance_by_position=acceptance_by_position(emitted, n) if per_position else [],
        drafts_verified_per_round=totals.drafts_verified / len(emitted) if emitted else math.nan,
        draft_lengths="; ".join(policy.summary() for policy in policies),
        **common,
    )


def format_table(rows: list[ComparisonRow]) -> str:
    header = (
        "| decoding | batch | drafter params | draft tokens | verified/round | tau | target passes/token | "
        "drafter passes/token | tokens/s | speedup vs plain (median over prompts, spread) | output == plain greedy |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        tau = "n/a" if math.isnan(r.acceptance_length) else f"{r.acceptance_length:.2f}"
        passes = "n/a" if math.isnan(r.target_passes_per_token) else f"{r.target_passes_per_token:.3f}"
        params = f"{r.drafter_params / 1e6:.2f}M" if r.drafter_params else "-"
        spread = "" if r.drafter == PLAIN else f" ({r.speedup_spread[0]:.2f}-{r.speedup_spread[1]:.2f})"
        lines.append(
            f"| {r.drafter} | {r.batch_size} | {params} | {r.num_draft_tokens} | {r.drafts_verified_per_round:.2f} | "
            f"{tau} | {passes} | "
            f"{r.drafter_passes_per_token:.3f} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x{spread} | "
            f"{'yes' if r.matches_plain_greedy else 'NO'} |"
        )
    return "\n".join(lines)
