"""Side-by-side runs of the reference loop: each drafter kind against plain greedy decoding of the same loop and,
optionally, what a user would otherwise run (HF `generate`, HF prompt lookup).

Used by `portable-spec demo` and `portable-spec bench`; all rows of one table come from one process and run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from .baselines import hf_generate
from .decode import GenerationConfig, SpeculativeDecoder
from .drafter import Drafter
from .target import TargetModel

PLAIN = "plain greedy (same loop, no drafter)"


@dataclass
class ComparisonRow:
    drafter: str
    num_draft_tokens: int
    acceptance_length: float  # tau: tokens emitted per verification round (nan where the baseline hides it)
    target_passes_per_token: float
    drafter_passes_per_token: float
    tokens_per_second: float
    speedup: float  # tokens/s relative to plain greedy decoding of the same loop, same prompts, same run
    matches_autoregressive: bool  # output equals plain greedy output token for token
    drafter_params: int = 0
    batch_size: int = 1
    # P(draft slot i accepted | slots < i accepted), i = 1..num_draft_tokens
    acceptance_by_position: list[float] = field(default_factory=list)


def acceptance_by_position(emitted_per_round: list[int], num_drafts: int) -> list[float]:
    """Conditional acceptance per draft slot from per-round emitted counts (accepted + 1)."""
    accepted = torch.tensor(emitted_per_round) - 1
    rates = []
    for slot in range(1, num_drafts + 1):
        reached = int((accepted >= slot - 1).sum())
        rates.append(float((accepted >= slot).sum()) / reached if reached else math.nan)
    return rates


def _run(decoder: SpeculativeDecoder, prompts, config: GenerationConfig, batch_size: int):
    tokens, rounds, drafter_passes, seconds, emitted = [], 0, 0, 0.0, []
    for start in range(0, len(prompts), batch_size):
        out = decoder.generate(prompts[start : start + batch_size], config)
        tokens += out.tokens
        rounds, drafter_passes = rounds + out.stats.rounds, drafter_passes + out.stats.drafter_passes
        seconds += out.stats.seconds
        emitted += out.stats.emitted_per_round
    return tokens, rounds, drafter_passes, seconds, emitted


def compare(
    target: TargetModel,
    drafters: dict[str, Drafter],
    prompts: list[list[int]],
    num_draft_tokens: list[int],
    max_new_tokens: int = 64,
    batch_size: int = 1,
    progress: bool = True,
    stop_token_ids: tuple[int, ...] = (),
    hf_baselines: bool = False,
    prompt_lookup_num_tokens: int = 10,
) -> list[ComparisonRow]:
    """Plain greedy first (the reference output), then every (drafter, num_draft_tokens) pair, then the HF
    baselines (batch 1, as HF's assisted generation requires)."""
    base = GenerationConfig(max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids)
    jobs = [(PLAIN, None, 0)] + [(name, drafter, n) for name, drafter in drafters.items() for n in num_draft_tokens]
    rows, reference, reference_tps = [], None, None
    for name, drafter, n in tqdm(jobs, desc="decode", disable=not progress):
        config = base.model_copy(update={"num_draft_tokens": max(n, 1)})
        with torch.inference_mode():
            tokens, rounds, drafter_passes, seconds, emitted = _run(
                SpeculativeDecoder(target, drafter), prompts, config, batch_size
            )
        generated = sum(len(t) for t in tokens)
        tps = generated / seconds
        if reference is None:
            reference, reference_tps = tokens, tps
        rows.append(ComparisonRow(
            drafter=name, num_draft_tokens=n,
            acceptance_length=sum(emitted) / len(emitted),
            target_passes_per_token=(rounds + len(prompts)) / generated,
            drafter_passes_per_token=drafter_passes / generated,
            tokens_per_second=tps, speedup=tps / reference_tps, matches_autoregressive=tokens == reference,
            drafter_params=sum(p.numel() for p in drafter.parameters()) if drafter is not None else 0,
            batch_size=batch_size, acceptance_by_position=acceptance_by_position(emitted, n) if n else [],
        ))
    if hf_baselines:
        for lookup in (None, prompt_lookup_num_tokens):
            run = hf_generate(target, prompts, max_new_tokens, stop_token_ids, lookup)
            tps = sum(len(t) for t in run.tokens) / run.seconds
            rows.append(ComparisonRow(
                drafter=run.name, num_draft_tokens=lookup or 0, acceptance_length=1.0 if lookup is None else math.nan,
                target_passes_per_token=1.0 if lookup is None else math.nan, drafter_passes_per_token=0.0,
                tokens_per_second=tps, speedup=tps / reference_tps, matches_autoregressive=run.tokens == reference,
            ))
    return rows


def format_table(rows: list[ComparisonRow]) -> str:
    header = ("| decoding | drafter params | draft tokens | tau | target passes/token | drafter passes/token | "
              "tokens/s | speedup vs plain | output == plain greedy |")
    lines = [header, "|" + "---|" * 9]
    for r in rows:
        tau = "n/a" if math.isnan(r.acceptance_length) else f"{r.acceptance_length:.2f}"
        passes = "n/a" if math.isnan(r.target_passes_per_token) else f"{r.target_passes_per_token:.3f}"
        params = f"{r.drafter_params / 1e6:.2f}M" if r.drafter_params else "-"
        lines.append(
            f"| {r.drafter} | {params} | {r.num_draft_tokens} | {tau} | {passes} | "
            f"{r.drafter_passes_per_token:.3f} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | "
            f"{'yes' if r.matches_autoregressive else 'NO'} |"
        )
    return "\n".join(lines)
