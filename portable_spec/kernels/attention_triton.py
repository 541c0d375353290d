"""Drafter attention for one block per request, fused: injected context KV + block KV, causal or full block mask.

Twin: portable_spec.core.attention.injected_attention with block_attention_mask. One program per
(request, kv head, context split) holds all `groups * k` query rows of that kv head, so each K/V tile is read
once for the whole GQA group (the drafter's k queries are few: this is decode-shaped, memory-bound attention).
Context validity (holes from rejected slots) is a [B, T] mask read per tile; the k block keys/values are read
by the last split. With several splits (long context, few heads), partial softmax states are merged by a
second small kernel (flash-decoding). Context length and split count are runtime arguments (not specialised), so
a decode loop whose context grows compiles each kernel once per variant (causal or not, dtype, head shape).
Softmax is online in fp32 (exp2); P @ V runs in tf32 for 16-bit inputs (P keeps 10 mantissa bits, V is exact)
and in IEEE fp32 for fp32 inputs. Import only through portable_spec.core.dispatch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

_LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(m, l, acc, s, v, UPCAST: tl.constexpr, PV_TF32: tl.constexpr):
    """One online-softmax update with scores s [M, N] (log2 units, -inf = masked) and values v [N, D].

    16-bit values: P @ V runs in tf32 (P keeps 10 mantissa bits, V is exact), so P is not rounded to bf16;
    fp32 values: IEEE fp32. The interpreter (UPCAST) truncates P to tf32, the worst case of the GPU path.
    """
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    v = v.to(tl.float32)
    if PV_TF32:
        if UPCAST:
            p = (p.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="tf32")
    else:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    return m_new, l, acc


@triton.jit(do_not_specialize=["T", "t_per_split", "num_splits", "svb"])
def _attention_kernel(
    Q,
    sqb,
    sqh,
    sqi,  # [B, H, k, d], last dim contiguous (so are all below)
    CK,
    sckb,
    sckh,
    sckt,  # [B, Hkv, T, d]
    CV,
    scvb,
    scvh,
    scvt,
    BK,
    sbkb,
    sbkh,
    sbki,  # [B, Hkv, k, d]
    BV,
    sbvb,
    sbvh,
    sbvi,
    VALID,
    svb,  # [B, T] uint8
    OUT,
    sob,
    soh,
    soi,  # [B, H, k, d], written when num_splits == 1
    PART_ACC,
    PART_M,
    PART_L,  # [B*Hkv, num_splits, BLOCK_M, BLOCK_D], [B*Hkv, num_splits, BLOCK_M] x2 fp32
    num_kv_heads,
    T,
    k,
    d,
    groups,
    t_per_split,
    num_splits,
    scale_log2,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    PV_TF32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid // num_kv_heads).to(tl.int64)
    kvh = (pid % num_kv_heads).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < groups * k
    slot = rows % k  # query slot in the block
    head = kvh * groups + rows // k
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < d
    q = tl.load(
        Q + b * sqb + head[:, None] * sqh + slot[:, None] * sqi + dims[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    t_begin = split * t_per_split
    t_end = tl.minimum(T, t_begin + t_per_split)
    for t0 in range(t_begin, t_end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        t_ok = t < t_end
        visible = tl.load(VALID + b * svb + t, mask=t_ok, other=0) != 0
        kv_mask = t_ok[:, None] & d_ok[None, :]
        keys = tl.load(CK + b * sckb + kvh * sckh + t[:, None] * sckt + dims[None, :], mask=kv_mask, other=0.0)
        values = tl.load(CV + b * scvb + kvh * scvh + t[:, None] * scvt + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            keys = keys.to(tl.float32)
        s = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale_log2
        s = tl.where(visible[None, :], s, -float("inf"))
        m, l, acc = _softmax_step(m, l, acc, s, values, UPCAST, PV_TF32)

    if split == num_splits - 1:
        j = tl.arange(0, BLOCK_K)
        j_ok = j < k
        kv_mask = j_ok[:, None] & d_ok[None, :]
        keys = tl.load(BK + b * sbkb + kvh * sbkh + j[:, None] * sbki + dims[None, :], mask=kv_mask, other=0.0)
        values = tl.load(BV + b * sbvb + kvh * sbvh + j[:, None] * sbvi + dims[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            keys = keys.to(tl.float32)
        s = tl.dot(q, tl.trans(keys), input_precision="ieee") * scale_log2
        visible = j_ok[None, :]
        if CAUSAL:
            visible = visible & (j[None, :] <= slot[:, None])
        s = tl.where(visible, s, -float("inf"))
        m, l, acc = _softmax_step(m, l, acc, s, values, UPCAST, PV_TF32)

    if num_splits == 1:
        out = acc / l[:, None]
        tl.store(
            OUT + b * sob + head[:, None] * soh + slot[:, None] * soi + dims[None, :],
            out.to(OUT.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )
    else:
        base = pid.to(tl.int64) * num_splits + split
        tl.store(PART_ACC + (base * BLOCK_M + rows[:, None]) * BLOCK_D + dims[None, :], acc)
        tl.store(PART_M + base * BLOCK_M + rows, m)
        tl.store(PART_L + base * BLOCK_M + rows, l)


@triton.jit(do_not_specialize=["num_splits"])
def _combine_kernel(
    PART_ACC,
    PART_M,
    PART_L,
    OUT,
    sob,
    soh,
    soi,
    num_kv_heads,
    k,
    d,
    groups,
    num_splits,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge the per-split softmax states of one (request, kv head) and write the output rows."""
    pid = tl.program_id(0)
    b = (pid // num_kv_heads).to(tl.int64)
    kvh = (pid % num_kv_heads).to(tl.int64)
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    m = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for split in range(num_splits):
        base = pid.to(tl.int64) * num_splits + split
        m_split = tl.load(PART_M + base * BLOCK_M + rows)
        m_new = tl.maximum(m, m_split)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        alpha, beta = tl.exp2(m - m_safe), tl.exp2(m_split - m_safe)
        l = l * alpha + tl.load(PART_L + base * BLOCK_M + rows) * beta
        part = tl.load(PART_ACC + (base * BLOCK_M + rows[:, None]) * BLOCK_D + dims[None, :])
        acc = acc * alpha[:, None] + part * beta[:, None]
        m = m_new
    row_ok = rows < groups * k
    slot = rows % k
    head = kvh * groups + rows // k
    tl.store(
        OUT + b * sob + head[:, None] * soh + slot[:, None] * soi + dims[None, :],
        (acc / l[:, None]).to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & (dims < d)[None, :],
    )


def injected_attention_triton(
    q: torch.Tensor,  # [B, H, k, d]
    context_k: torch.Tensor,  # [B, Hkv, T, d]
    context_v: torch.Tensor,  # [B, Hkv, T, d]
    block_k: torch.Tensor,  # [B, Hkv, k, d]
    block_v: torch.Tensor,  # [B, Hkv, k, d]
    context_valid: torch.Tensor,  # [B, T] bool
    block_causal: bool,
    num_splits: int | None = None,  # context splits per (request, kv head); None = enough to fill the device
    block_t: int = 64,
) -> torch.Tensor:  # [B, H, k, d]
    """Launch the fused attention; same contract as the torch twin in portable_spec.core.dispatch.attention_reference."""
    batch, heads, k, d = q.shape
    kv_heads, ctx_len = context_k.shape[1], context_k.shape[2]
    groups = heads // kv_heads
    q, context_k, context_v, block_k, block_v = (
        _last_dim_contiguous(x) for x in (q, context_k, context_v, block_k, block_v)
    )
    valid = context_valid.to(torch.bool).contiguous().view(torch.uint8)
    upcast = not q.is_cuda  # interpreter: numpy has no bfloat16 and its fp32 -> bf16 cast truncates
    out = torch.empty(q.shape, dtype=torch.float32 if upcast else q.dtype, device=q.device)
    block_m = max(16, triton.next_power_of_2(groups * k))
    block_d = max(16, triton.next_power_of_2(d))
    block_t = max(16, block_t)
    tiles = max(1, triton.cdiv(ctx_len, block_t))
    if num_splits is None:
        num_splits = _default_splits(q.device, batch * kv_heads, tiles)
    t_per_split = triton.cdiv(tiles, max(1, min(num_splits, tiles))) * block_t
    splits = max(1, triton.cdiv(ctx_len, t_per_split))
    programs = batch * kv_heads
    if programs == 0:
        return out.to(q.dtype)
    # fp32 partial-state buffers always (one-element placeholders for a single split): the pointer types, and so
    # the compiled kernel, are the same whatever the context length and split count
    parts = (programs, splits) if splits > 1 else (1, 1)
    part_acc = torch.empty(*parts, block_m, block_d, dtype=torch.float32, device=q.device)
    part_m = torch.empty(*parts, block_m, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    _attention_kernel[(programs, splits)](
        q,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        context_k,
        context_k.stride(0),
        context_k.stride(1),
        context_k.stride(2),
        context_v,
        context_v.stride(0),
        context_v.stride(1),
        context_v.stride(2),
        block_k,
        block_k.stride(0),
        block_k.stride(1),
        block_k.stride(2),
        block_v,
        block_v.stride(0),
        block_v.stride(1),
        block_v.stride(2),
        valid,
        valid.stride(0),
        out,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        part_acc,
        part_m,
        part_l,
        kv_heads,
        ctx_len,
        k,
        d,
        groups,
        t_per_split,
        splits,
        _LOG2E / math.sqrt(d),
        CAUSAL=bool(block_causal),
        UPCAST=upcast,
        PV_TF32=q.element_size() < 4,
        BLOCK_M=block_m,
        BLOCK_T=block_t,
        BLOCK_K=max(16, triton.next_power_of_2(k)),
        BLOCK_D=block_d,
        num_warps=4 if block_m * block_d <= 64 * 64 else 8,
    )
    if splits > 1:
        _combine_kernel[(programs,)](
            part_acc,
            part_m,
            part_l,
            out,
            out.stride(0),
            out.stride(1),
            out.stride(2),
            kv_heads,
            k,
            d,
            groups,
            splits,
            BLOCK_M=block_m,
            BLOCK_D=block_d,
        )
    return out.to(q.dtype)


def bytes_moved(batch: int, heads: int, kv_heads: int, ctx_len: int, k: int, d: int, itemsize: int) -> int:
    """HBM bytes the kernel must move: q and out, context and block K/V once per kv head, the validity mask."""
    return itemsize * (2 * batch * heads * k * d + 2 * batch * kv_heads * (ctx_len + k) * d) + batch * ctx_len


def _default_splits(device: torch.device, programs: int, tiles: int) -> int:
    if device.type != "cuda":
        return 1
    target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(tiles, triton.cdiv(target, max(1, programs))))


# True when TRITON_INTERPRET=1 was set at triton's first import: the kernel then runs on CPU tensors (slowly)
INTERPRETED: bool = isinstance(_attention_kernel, InterpretedFunction)


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
