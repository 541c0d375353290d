"""Side-by-side runs of the reference loop: each drafter kind against plain greedy decoding of the same loop and,
optionally, what a user would otherwise run (HF `generate`, HF prompt lookup).

Used by `portable-spec demo` and `portable-spec bench`; all rows of one table come from one process and run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from portable_spec.bench.baselines import hf_generate
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder, acceptance_by_position
from portable_spec.core.drafter import Drafter
from portable_spec.core.target import TargetModel

PLAIN = "plain greedy (same loop, no drafter)"


@dataclass(frozen=True)
class DecodeJob:
    """One row of a comparison: a drafter (None = plain greedy), its draft tokens per round and confidence cut."""

    name: str
    drafter: Drafter | None
    num_draft_tokens: int
    draft_confidence: float = 0.0
    decode_matmul: bool = True  # False: torch's own F.linear layout throughout (decode_matmul.py)


def grid(drafters: dict[str, Drafter], num_draft_tokens: list[int], draft_confidence: float = 0.0) -> list[DecodeJob]:
    suffix = f" (cut < {draft_confidence:g})" if draft_confidence else ""
    return [
        DecodeJob(name + suffix, drafter, n, draft_confidence)
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
    tokens_per_second: float
    speedup: float  # tokens/s relative to plain greedy decoding of the same loop, same prompts, same run
    matches_plain_greedy: bool  # output equals plain greedy output token for token
    drafter_params: int = 0
    batch_size: int = 1
    # P(draft slot i accepted | slots < i accepted), i = 1..num_draft_tokens
    acceptance_by_position: list[float] = field(default_factory=list)
    drafts_verified_per_round: float = 0.0  # < num_draft_tokens when rounds are cut by confidence


@dataclass
class RunTotals:
    """One job's decode statistics summed over its batches."""

    tokens: list[list[int]] = field(default_factory=list)
    rounds: int = 0
    drafter_passes: int = 0
    seconds: float = 0.0
    emitted_per_round: list[int] = field(default_factory=list)
    drafts_verified: int = 0


def _run(decoder: SpeculativeDecoder, prompts, config: GenerationConfig, batch_size: int) -> RunTotals:
    totals = RunTotals()
    for start in range(0, len(prompts), batch_size):
        out = decoder.generate(prompts[start : start + batch_size], config)
        totals.tokens += out.tokens
        totals.rounds += out.stats.rounds
        totals.drafter_passes += out.stats.drafter_passes
        totals.seconds += out.stats.seconds
        totals.emitted_per_round += out.stats.emitted_per_round
        totals.drafts_verified += out.stats.drafts_verified
    return totals


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
) -> list[ComparisonRow]:
    """Plain greedy first (the reference output), then every job, then the HF baselines (batch 1, as HF's
    assisted generation requires)."""
    base = GenerationConfig(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
    rows, reference, reference_tps = [], None, None
    for job in tqdm([DecodeJob(PLAIN, None, 0)] + jobs, desc="decode", disable=not progress):
        config = base.model_copy(
            update={"num_draft_tokens": max(job.num_draft_tokens, 1), "draft_confidence": job.draft_confidence}
        )
        with torch.inference_mode():
            run = _run(SpeculativeDecoder(target, job.drafter, job.decode_matmul), prompts, config, batch_size)
        emitted = run.emitted_per_round
        generated = sum(len(t) for t in run.tokens)
        tps = generated / run.seconds
        if reference is None:
            reference, reference_tps = run.tokens, tps
        n = job.num_draft_tokens
        rows.append(
            ComparisonRow(
                drafter=job.name,
                num_draft_tokens=n,
                acceptance_length=sum(emitted) / len(emitted) if emitted else math.nan,  # no round: prefill only
                target_passes_per_token=(run.rounds + len(prompts)) / generated,
                drafter_passes_per_token=run.drafter_passes / generated,
                tokens_per_second=tps,
                speedup=tps / reference_tps,
                matches_plain_greedy=run.tokens == reference,
                drafter_params=sum(p.numel() for p in job.drafter.parameters()) if job.drafter is not None else 0,
                batch_size=batch_size,
                acceptance_by_position=(acceptance_by_position(emitted, n) if n and not job.draft_confidence else []),
                drafts_verified_per_round=run.drafts_verified / len(emitted) if emitted else math.nan,
            )
        )
    if hf_baselines:
        for lookup in (None, prompt_lookup_num_tokens):
            run = hf_generate(target, prompts, max_new_tokens, stop_token_ids, lookup)
            tps = sum(len(t) for t in run.tokens) / run.seconds
            rows.append(
                ComparisonRow(
                    drafter=run.name,
                    num_draft_tokens=lookup or 0,
                    acceptance_length=1.0 if lookup is None else math.nan,
                    target_passes_per_token=1.0 if lookup is None else math.nan,
                    drafter_passes_per_token=0.0,
                    tokens_per_second=tps,
                    speedup=tps / reference_tps,
                    matches_plain_greedy=run.tokens == reference,
                )
            )
    return rows


def format_table(rows: list[ComparisonRow]) -> str:
    header = (
        "| decoding | batch | drafter params | draft tokens | verified/round | tau | target passes/token | "
        "drafter passes/token | tokens/s | speedup vs plain | output == plain greedy |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        tau = "n/a" if math.isnan(r.acceptance_length) else f"{r.acceptance_length:.2f}"
        passes = "n/a" if math.isnan(r.target_passes_per_token) else f"{r.target_passes_per_token:.3f}"
        params = f"{r.drafter_params / 1e6:.2f}M" if r.drafter_params else "-"
        lines.append(
            f"| {r.drafter} | {r.batch_size} | {params} | {r.num_draft_tokens} | {r.drafts_verified_per_round:.2f} | "
            f"{tau} | {passes} | "
            f"{r.drafter_passes_per_token:.3f} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | "
            f"{'yes' if r.matches_plain_greedy else 'NO'} |"
        )
    return "\n".join(lines)
