"""Fused verification over a block: one Triton program per request. Twin: portable_spec.core.verify.verify.

Given p (from portable_spec.core.sampling.target_probs, computed outside), the kernel runs the acceptance test
on the n draft slots, finds accepted_len, and samples the recovered/bonus token with the exponential race
over the one vocab row it needs, reading p, q and the noise of that row once. Every operation is the
reference's, in the same precision: u * q <= p, clamp(p - q, 0), -log(u), an IEEE-rounded division and a
first-index argmax in which NaN wins (torch.argmax semantics). On CUDA the log is libdevice's __nv_logf,
the function torch's CUDA log calls, so tokens are identical to the reference on the same device.
Import only through portable_spec.core.dispatch: importing this module imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime.interpreter import InterpretedFunction

from portable_spec.core.noise import VerifyNoise
from portable_spec.core.verify import VerifyResult


@triton.jit
def _verify_kernel(
    P,
    stride_pb,
    stride_pn,  # [B, n+1, V] float32, last dim contiguous
    DRAFT,
    stride_db,  # [B, n] int64
    QPROBS,
    stride_qb,
    stride_qn,  # [B, n, V] draft probs (any float dtype); unused if not HAS_QPROBS
    UACC,
    stride_ab,  # [B, n] float32 accept uniforms
    USAMP,
    stride_ub,
    stride_un,  # [B, n+1, V] float32 sample uniforms
    NUM_DRAFTS,  # [B] int64
    ACCEPTED_LEN,
    NEXT_TOKEN,  # [B] int64 out
    OUTPUT,
    stride_ob,  # [B, n+1] int64 out
    n,
    V,
    HAS_QPROBS: tl.constexpr,
    USE_LIBDEVICE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    slots = tl.arange(0, BLOCK_N)
    num_drafts = tl.minimum(tl.maximum(tl.load(NUM_DRAFTS + b), 0), n)
    in_draft = slots < num_drafts  # padding after a ragged request's drafts is never read
    draft = tl.load(DRAFT + b * stride_db + slots, mask=in_draft, other=0)
    # acceptance test on every draft slot at once; accepted_len = first slot that fails
    p_draft = tl.load(P + b * stride_pb + slots * stride_pn + draft, mask=in_draft, other=0.0)
    if HAS_QPROBS:
        q_draft = tl.load(QPROBS + b * stride_qb + slots * stride_qn + draft, mask=in_draft, other=0.0).to(tl.float32)
    else:
        q_draft = tl.where(in_draft, 1.0, 0.0)
    u_accept = tl.load(UACC + b * stride_ab + slots, mask=in_draft, other=1.0)
    accepted = (q_draft > 0) & (u_accept * q_draft <= p_draft) & in_draft  # q = 0: rejected (verify.py)
    accepted_len = tl.min(tl.where(accepted, BLOCK_N, slots), axis=0)
    has_q = accepted_len < num_drafts  # the slot that decides next_token has a draft (q row), else q = 0
    q_limit = tl.where(has_q, V, 0)  # q row lanes to read: none when the slot has no draft
    rejected_token = tl.sum(tl.where(slots == accepted_len, draft, 0), axis=0)

    p_row = P + b * stride_pb + accepted_len * stride_pn
    u_row = USAMP + b * stride_ub + accepted_len * stride_un
    q_row = QPROBS + b * stride_qb + accepted_len * stride_qn
    any_residual = tl.full([], 0.0, tl.float32)
    best_res = tl.full([], -float("inf"), tl.float32)
    best_p = tl.full([], -float("inf"), tl.float32)
    best_res_idx = tl.full([], 0, tl.int32)
    best_p_idx = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK_V):
        vocab = start + tl.arange(0, BLOCK_V)
        in_vocab = vocab < V
        p = tl.load(p_row + vocab, mask=in_vocab, other=0.0)
        u = tl.load(u_row + vocab, mask=in_vocab, other=0.5)
        if HAS_QPROBS:
            q = tl.load(q_row + vocab, mask=vocab < q_limit, other=0.0).to(tl.float32)
        else:
            q = tl.where((vocab == rejected_token) & has_q, 1.0, 0.0)
        residual = tl.maximum(p - q, 0.0)
        any_residual = tl.maximum(any_residual, tl.max(residual, axis=0))
        if USE_LIBDEVICE:
            exponential = -libdevice.log(u)
        else:
            exponential = -tl.log(u)
        ratio_res = tl.math.div_rn(residual, exponential)
        ratio_res = tl.where(ratio_res != ratio_res, float("inf"), ratio_res)  # NaN wins, as in torch.argmax
        ratio_res = tl.where(in_vocab, ratio_res, -float("inf"))
        ratio_p = tl.math.div_rn(p, exponential)
        ratio_p = tl.where(ratio_p != ratio_p, float("inf"), ratio_p)
        ratio_p = tl.where(in_vocab, ratio_p, -float("inf"))
        tile_res, tile_res_idx = tl.max(ratio_res, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tile_p, tile_p_idx = tl.max(ratio_p, axis=0, return_indices=True, return_indices_tie_break_left=True)
        take_res = tile_res > best_res  # strict: an earlier tile keeps ties (first index)
        best_res_idx = tl.where(take_res, start + tile_res_idx, best_res_idx)
        best_res = tl.where(take_res, tile_res, best_res)
        take_p = tile_p > best_p
        best_p_idx = tl.where(take_p, start + tile_p_idx, best_p_idx)
        best_p = tl.where(take_p, tile_p, best_p)
    next_token = tl.where(any_residual > 0, best_res_idx, best_p_idx).to(tl.int64)

    tl.store(ACCEPTED_LEN + b, accepted_len.to(tl.int64))
    tl.store(NEXT_TOKEN + b, next_token)
    out = tl.where(slots < accepted_len, draft, -1)
    out = tl.where(slots == accepted_len, next_token, out)
    tl.store(OUTPUT + b * stride_ob + slots, out, mask=slots <= n)


def verify_probs(
    p: torch.Tensor,  # [B, n+1, V] float32 from target_probs
    draft_tokens: torch.Tensor,  # [B, n]
    noise: VerifyNoise,
    draft_probs: torch.Tensor | None = None,  # [B, n, V]; None = one-hot drafts
    num_drafts: torch.Tensor | None = None,  # [B]
    block_v: int = 1024,
) -> VerifyResult:
    """Launch the fused kernel on p; same contract and outputs as verify() after target_probs."""
    batch, n = draft_tokens.shape
    vocab = p.shape[-1]
    device = p.device
    p = _last_dim_contiguous(p.to(torch.float32))
    draft_tokens = draft_tokens.to(torch.int64).contiguous()
    if num_drafts is None:
        num_drafts = torch.full((batch,), n, dtype=torch.int64, device=device)
    num_drafts = num_drafts.to(device=device, dtype=torch.int64).contiguous()
    accept_uniform = noise.accept_uniform.to(torch.float32).contiguous()
    sample_uniform = _last_dim_contiguous(noise.sample_uniform.to(torch.float32))
    qprobs = p if draft_probs is None else _last_dim_contiguous(draft_probs)
    accepted_len = torch.empty(batch, dtype=torch.int64, device=device)
    next_token = torch.empty(batch, dtype=torch.int64, device=device)
    output = torch.empty(batch, n + 1, dtype=torch.int64, device=device)
    if batch == 0:
        return VerifyResult(accepted_len=accepted_len, next_token=next_token, output_tokens=output)
    _verify_kernel[(batch,)](
        p,
        p.stride(0),
        p.stride(1),
        draft_tokens,
        draft_tokens.stride(0),
        qprobs,
        qprobs.stride(0),
        qprobs.stride(1),
        accept_uniform,
        accept_uniform.stride(0),
        sample_uniform,
        sample_uniform.stride(0),
        sample_uniform.stride(1),
        num_drafts,
        accepted_len,
        next_token,
        output,
        output.stride(0),
        n,
        vocab,
        HAS_QPROBS=draft_probs is not None,
        USE_LIBDEVICE=p.is_cuda,
        BLOCK_N=triton.next_power_of_2(n + 1),
        BLOCK_V=min(block_v, triton.next_power_of_2(vocab)),
        enable_fp_fusion=False,  # the reference rounds every product on its own: no FMA contraction
    )
    return VerifyResult(accepted_len=accepted_len, next_token=next_token, output_tokens=output)


def bytes_moved(batch: int, n: int, vocab: int, has_draft_probs: bool, draft_itemsize: int = 4) -> int:
    """HBM bytes the kernel must move: one p row, one noise row (and one q row) per request, plus the small slots."""
    per_request = vocab * (4 + 4 + (draft_itemsize if has_draft_probs else 0)) + n * (8 + 4 + 4) + (n + 1) * 8 + 24
    return batch * per_request


# True when TRITON_INTERPRET=1 was set at triton's first import: the kernel then runs on CPU tensors (slowly)
INTERPRETED: bool = isinstance(_verify_kernel, InterpretedFunction)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
