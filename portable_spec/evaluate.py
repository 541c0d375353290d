"""Side-by-side runs of the reference loop: each drafter kind against plain autoregressive decoding.

Used by `portable-spec demo` and `portable-spec bench`; all rows of one table come from one process and run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from .decode import GenerationConfig, SpeculativeDecoder
from .drafter import Drafter
from .target import TargetModel


@dataclass
class ComparisonRow:
    drafter: str
    num_draft_tokens: int
    acceptance_length: float  # tau: tokens emitted per verification round
    target_passes_per_token: float
    drafter_passes_per_token: float
    tokens_per_second: float
    speedup: float  # tokens/s relative to autoregressive, same prompts, same run
    matches_autoregressive: bool


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
) -> list[ComparisonRow]:
    """Autoregressive first (the reference output), then every (drafter, num_draft_tokens) pair."""
    base = GenerationConfig(max_new_tokens=max_new_tokens)
    jobs = [("autoregressive (no drafter)", None, 0)] + [
        (name, drafter, n) for name, drafter in drafters.items() for n in num_draft_tokens
    ]
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
        ))
    return rows


def format_table(rows: list[ComparisonRow]) -> str:
    header = "| drafter | draft tokens | tau | target passes/token | drafter passes/token | tokens/s | speedup | output == AR |"
    lines = [header, "|" + "---|" * 8]
    for r in rows:
        lines.append(
            f"| {r.drafter} | {r.num_draft_tokens} | {r.acceptance_length:.2f} | {r.target_passes_per_token:.3f} | "
            f"{r.drafter_passes_per_token:.3f} | {r.tokens_per_second:.1f} | {r.speedup:.2f}x | "
            f"{'yes' if r.matches_autoregressive else 'NO'} |"
        )
    return "\n".join(lines)
