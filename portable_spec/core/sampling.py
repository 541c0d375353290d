"""Sampling parameters and the one function that turns target logits into the distribution p to match.

Every backend calls `target_probs`; temperature 0 gives a one-hot argmax (first index on ties), which
makes greedy decoding a special case of rejection sampling rather than a second code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field

# Temperatures below this are greedy: logits / T overflows float32 for T ~ 1e-38 and the distribution is one-hot
# to float precision long before (a 1e-3 logit gap at T = 1e-5 is a factor e^100).
MIN_TEMPERATURE = 1e-5


class SamplingParams(BaseModel):
    """Per-request sampling settings, as a user gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(
        0.0,
        ge=0.0,
        allow_inf_nan=False,
        description=f"0 = greedy; below {MIN_TEMPERATURE:g} also greedy (dividing by it overflows).",
    )
    top_k: int = Field(0, ge=0, le=2**31 - 1, description="Keep the k most likely tokens; 0 = off.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Keep the smallest set with mass >= top_p; 1 = off.")


@dataclass
class SamplingBatch:
    """Flat per-request tensors of sampling settings."""

    temperature: torch.Tensor  # [B] float32
    top_k: torch.Tensor  # [B] int64
    top_p: torch.Tensor  # [B] float32

    @classmethod
    def from_params(cls, params: list[SamplingParams], device: torch.device | str = "cpu") -> "SamplingBatch":
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        )


def target_probs(logits: torch.Tensor, sampling: SamplingBatch) -> torch.Tensor:
    """logits [B, n, V] -> probabilities [B, n, V] (float32) after temperature, top-k and top-p."""
    logits = logits.to(torch.float32)
    if not bool(torch.isfinite(logits).all()):  # one pass (and one sync) per call on the common, finite path
        logits = _without_non_finite(logits)
    vocab = logits.shape[-1]
    greedy = sampling.temperature < MIN_TEMPERATURE
    one_hot = torch.nn.functional.one_hot(logits.argmax(dim=-1), vocab).to(torch.float32)
    if bool(greedy.all()):  # same result as below, without the sort
        return one_hot
    temperature = torch.where(greedy, 1.0, sampling.temperature)[:, None, None]
    sorted_logits, order = torch.sort(logits / temperature, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=logits.device)
    top_k = torch.where(sampling.top_k > 0, sampling.top_k, vocab)[:, None, None]
    sorted_logits = sorted_logits.masked_fill(rank >= top_k, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep = (mass_before < sampling.top_p[:, None, None]) | (rank == 0)
    sorted_probs = sorted_probs * keep
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    probs = torch.empty_like(sorted_probs).scatter_(-1, order, sorted_probs)
    return torch.where(greedy[:, None, None], one_hot, probs)


def _without_non_finite(logits: torch.Tensor) -> torch.Tensor:
    """NaN or an all -inf slot is an error naming the slot; +inf is certainty: the slot's distribution becomes
    uniform over its +inf entries (argmax: the first); other -inf entries are masked tokens and stay."""
    nan, all_neginf = torch.isnan(logits).any(dim=-1), torch.isneginf(logits).all(dim=-1)
    if bool(nan.any()):
        bad = nan.nonzero()[0].tolist()
        raise ValueError(
            f"target logits contain NaN (request {bad[0]}, chain slot {bad[1]}); the target model diverged: "
            "check its dtype/weights, speculative decoding cannot verify against NaN"
        )
    if bool(all_neginf.any()):
        bad = all_neginf.nonzero()[0].tolist()
        raise ValueError(
            f"target logits are all -inf (request {bad[0]}, chain slot {bad[1]}): no token is possible; check the "
            "target's logits processors / masks"
        )
    posinf = torch.isposinf(logits)
    return torch.where(posinf.any(dim=-1, keepdim=True), torch.where(posinf, 0.0, float("-inf")), logits)


def sample_from(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """probs [..., V], uniforms in (0, 1) [..., V] -> one token per row [...]: the exponential race
    argmax_v p_v / E_v, E_v = -log(u_v) (what verify samples with; exact given the same p and noise)."""
    return (probs / -torch.log(uniform)).argmax(dim=-1)


@dataclass
class DraftSampler:
    """How a drafter that picks its drafts slot after slot (dflash2's selector, dspark's Markov chain) samples them at
    T > 0: draft i of row b is drawn from q = target_probs(its logits), the request's own temperature, top-k and
    top-p (a greedy row's q is one-hot), with the keyed draft noise of its position; q is what verification then
    uses, so the output follows the target's distribution whatever q is (vLLM's rejection sampler takes the
    drafter's probabilities the same way)."""

    sampling: SamplingBatch
    uniforms: torch.Tensor  # [B, n, V]: noise.draft_uniforms

    def __call__(self, index: int, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft `index`'s logits [B, V] -> (its tokens [B], the q they were drawn from [B, V])."""
        q = target_probs(logits[:, None], self.sampling)[:, 0]
        return sample_from(q, self.uniforms[:, index]), q


def greedy_with_probability(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, n, V] -> (argmax [B, n], its softmax probability [B, n]): a greedy draft and the drafter's
    probability of it (what confidence cuts multiply)."""
    tokens = logits.argmax(dim=-1)
    return tokens, logits.float().softmax(dim=-1).gather(-1, tokens[..., None])[..., 0]
