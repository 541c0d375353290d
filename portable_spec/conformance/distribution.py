"""Losslessness at T > 0: the tokens a verifier emits must follow the target distribution p, whatever q is.

Many independent keyed draws (one request id each) go through one `verify` call with a single draft token:
the first emitted token (accepted draft or recovered token) must be distributed as p at slot 0, and the
bonus token after an acceptance as p at slot 1. Chi-square goodness of fit, with a fixed seed so the outcome
is deterministic; ALPHA is chosen so that the correct verifier passes while the classic bugs (accepting with
p instead of min(1, p/q), resampling from p instead of the residual, inverse-CDF on an unnormalised residual)
fail by many orders of magnitude (tests/conformance/test_distribution.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from portable_spec.core.noise import VerifyNoise, keyed_uniforms
from portable_spec.core.sampling import SamplingBatch, SamplingParams, target_probs
from portable_spec.core.verify import VerifyResult

ALPHA = 1e-3
DRAWS = 20_000
SEED = 20260
STREAM_DRAFT = 7  # a stream verify never reads: draft tokens are independent of the verifier's noise
SAMPLING = SamplingParams(temperature=0.9, top_k=6, top_p=0.9)
TARGET_LOGITS = torch.tensor(
    [
        [2.0, 1.6, 1.2, 0.9, 0.4, 0.0, -0.5, -2.0],  # slot 0: decides the first emitted token
        [0.3, 1.1, -0.2, 0.8, 1.5, -1.0, 0.0, 0.6],  # slot 1: the bonus token after an acceptance
    ]
)
DENSE_Q = torch.tensor([0.05, 0.10, 0.30, 0.05, 0.20, 0.10, 0.15, 0.05])  # mass on tokens p cuts (top-k/top-p)
ONE_HOT_DRAFT = 2  # deterministic drafts, the common case

VerifyFn = Callable[..., VerifyResult]


@dataclass
class FitResult:
    scenario: str
    statistic: float
    dof: int
    p_value: float
    total_variation: float
    impossible_tokens: list[int]  # emitted although p = 0

    @property
    def ok(self) -> bool:
        return self.p_value >= ALPHA and not self.impossible_tokens

    def __str__(self) -> str:
        return (
            f"{self.scenario}: chi2={self.statistic:.1f} (dof {self.dof}), p-value={self.p_value:.3g}, "
            f"TV={self.total_variation:.4f}"
            + (f", emitted p=0 tokens {self.impossible_tokens}" if self.impossible_tokens else "")
        )


def chi_square(counts: torch.Tensor, probs: torch.Tensor, scenario: str) -> FitResult:
    """Goodness of fit of integer counts [V] to probs [V] over the support of probs."""
    counts, probs = counts.to(torch.float64), probs.to(torch.float64)
    draws, support = counts.sum(), probs > 0
    expected = draws * probs[support]
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    p_value = torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2)
    return FitResult(
        scenario,
        float(statistic),
        dof,
        float(p_value),
        float(0.5 * (counts / draws - probs).abs().sum()),
        (~support & (counts > 0)).nonzero()[:, 0].tolist(),
    )


def distribution_fits(verify_fn: VerifyFn, draws: int = DRAWS) -> list[FitResult]:
    """Chi-square fits of a verifier's emitted tokens to p, for a dense q and for one-hot drafts."""
    vocab = TARGET_LOGITS.shape[-1]
    sampling = SamplingBatch.from_params([SAMPLING] * draws)
    p = target_probs(TARGET_LOGITS[None], SamplingBatch.from_params([SAMPLING]))[0]  # [2, V]
    request_ids = torch.arange(draws)
    first_positions = torch.full((draws,), 50)
    race = keyed_uniforms(SEED, request_ids, first_positions[:, None], STREAM_DRAFT, vocab)[:, 0]  # [N, V]
    dense_drafts = (DENSE_Q / -torch.log(race)).argmax(dim=-1)  # d ~ q, by the exponential race
    scenarios = {
        "dense q": (dense_drafts, DENSE_Q.expand(draws, 1, vocab).contiguous()),
        "one-hot draft": (torch.full((draws,), ONE_HOT_DRAFT), None),
    }
    fits = []
    for name, (drafts, draft_probs) in scenarios.items():
        noise = VerifyNoise.for_chain(SEED, request_ids, first_positions, 1, vocab)
        result = verify_fn(
            TARGET_LOGITS.expand(draws, -1, -1).contiguous(), drafts[:, None], sampling, noise, draft_probs, None
        )
        first = result.output_tokens[:, 0]
        fits.append(chi_square(torch.bincount(first, minlength=vocab), p[0], f"{name}, first token"))
        bonus = result.output_tokens[result.accepted_len == 1, 1]
        fits.append(chi_square(torch.bincount(bonus, minlength=vocab), p[1], f"{name}, bonus token"))
    return fits


def two_sample_p_value(a: list[list[int]], b: list[list[int]], position: int) -> float:
    """Chi-square homogeneity test: do the tokens at `position` of two sets of samples come from one distribution?
    Tokens seen under 10 times in both sets together are merged into one category; p-value from the chi-square
    survival function."""
    tokens = sorted({row[position] for row in a + b})
    counts = torch.tensor(
        [[sum(row[position] == t for row in arm) for t in tokens] for arm in (a, b)], dtype=torch.float64
    )
    keep = counts.sum(0) >= 10
    table = torch.cat((counts[:, keep], counts[:, ~keep].sum(1, keepdim=True)), dim=1)
    table = table[:, table.sum(0) > 0]
    if table.shape[1] < 2:
        return 1.0  # one category: nothing distinguishes the sets
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    dof = torch.tensor((table.shape[1] - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))
