"""Verification: which draft tokens the target accepts, and the token it adds. Shared by every backend.

Definitions (used across the project):
- accepted tokens: the longest prefix of the draft that passes the test below (greedy: equals the target's
  argmax; sampling: q(d) > 0 and u * q(d) <= p(d), i.e. accepted with probability min(1, p/q)). A draft its own
  drafter gave probability 0 is rejected, as vLLM's rejection sampler does: with q = 0 the test would otherwise
  accept a token the target gives p = 0.
- recovered token: at the first rejected slot, a sample from norm(max(p - q, 0)) (greedy: the argmax).
- bonus token: when every draft is accepted, a sample from p at the slot after the last draft.
`next_token` is the recovered or the bonus token; a step emits accepted tokens + next_token.
Sampling uses the exponential race argmax_v r_v / E_v, E_v = -log(u_v), which needs no normalisation
and no cumulative sum, so it is exact given the same p, q and noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, target_probs


@dataclass
class VerifyResult:
    accepted_len: torch.Tensor  # [B] accepted draft tokens, 0..num_drafts[b]
    next_token: torch.Tensor  # [B] recovered or bonus token
    output_tokens: torch.Tensor  # [B, n+1] accepted drafts then next_token, padded with -1


def check_chain_shapes(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> None:
    """target_logits [B, n+1, V] score the anchor and each of the n draft tokens [B, n] (every verify implementation)."""
    batch, n = draft_tokens.shape
    if target_logits.shape[:2] != (batch, n + 1):
        raise ValueError(
            f"target_logits has shape {tuple(target_logits.shape)}, expected [batch={batch}, n+1={n + 1}, vocab]: "
            "score the anchor and every draft token"
        )


def verify(
    target_logits: torch.Tensor,  # [B, n+1, V]: slot i scores the token after chain slot i
    draft_tokens: torch.Tensor,  # [B, n]
    sampling: SamplingBatch,
    noise: VerifyNoise,
    draft_probs: torch.Tensor | None = None,  # [B, n, V]; None = deterministic drafts (q one-hot)
    num_drafts: torch.Tensor | None = None,  # [B] ragged draft lengths; None = all n
) -> VerifyResult:
    check_chain_shapes(target_logits, draft_tokens)
    batch, n = draft_tokens.shape
    device = target_logits.device
    draft_tokens = draft_tokens.to(torch.int64)
    if num_drafts is None:
        num_drafts = torch.full((batch,), n, dtype=torch.int64, device=device)
    p = target_probs(target_logits, sampling)  # [B, n+1, V]
    q = torch.zeros_like(p)
    if draft_probs is None:
        q[:, :n].scatter_(-1, draft_tokens[..., None], 1.0)
    else:
        q[:, :n] = draft_probs.to(torch.float32)
    in_draft = torch.arange(n + 1, device=device) < num_drafts[:, None]  # [B, n+1]
    q = q * in_draft[..., None]

    p_draft = p[:, :n].gather(-1, draft_tokens[..., None])[..., 0]
    q_draft = q[:, :n].gather(-1, draft_tokens[..., None])[..., 0]
    accepted = (q_draft > 0) & (noise.accept_uniform * q_draft <= p_draft) & in_draft[:, :n]
    accepted_len = accepted.to(torch.int64).cumprod(dim=-1).sum(dim=-1)

    rows = torch.arange(batch, device=device)
    p_next, q_next = p[rows, accepted_len], q[rows, accepted_len]  # [B, V]
    residual = (p_next - q_next).clamp(min=0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_next)
    exponential = -torch.log(noise.sample_uniform[rows, accepted_len])
    next_token = (residual / exponential).argmax(dim=-1)

    slots = torch.arange(n + 1, device=device)
    output = torch.cat((draft_tokens, draft_tokens.new_zeros(batch, 1)), dim=1)
    output = torch.where(slots < accepted_len[:, None], output, -1)
    output[rows, accepted_len] = next_token
    return VerifyResult(accepted_len=accepted_len, next_token=next_token, output_tokens=output)
