"""Drafter building blocks (Qwen3-style): rotary embedding, KV-injected attention, SwiGLU MLP, decoder layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from portable_spec.core.attention import BlockMask, injected_attention
from portable_spec.core.dispatch import attention_op
from portable_spec.core.spec import MAX_POSITION_EMBEDDINGS, DrafterConfig


def rotary_frequencies(config: DrafterConfig) -> tuple[torch.Tensor | None, float]:
    """(inverse frequencies [head_dim/2] on the CPU, cos/sin scale) for a YaRN-scaled rotary, computed by
    transformers' own `_compute_yarn_parameters` (what HF Qwen3 runs); (None, 1.0) for plain rotary, whose
    frequencies rotary_cos_sin computes on the positions' device."""
    if config.rope_scaling is None:
        return None, 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = Qwen3Config(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        head_dim=config.head_dim,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rope_parameters=config.rope_parameters(),
    )
    with torch.device("cpu"):  # also when the drafter is built on the meta device (expected_weight_shapes)
        inv_freq, scale = ROPE_INIT_FUNCTIONS[config.rope_scaling.rope_type](hf, torch.device("cpu"))
    return inv_freq.to(torch.float32), float(scale)


def rotary_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    dtype: torch.dtype,
    frequencies: tuple[torch.Tensor | None, float] = (None, 1.0),
):
    """cos/sin tables for `positions` [B, T] -> each [B, 1, T, head_dim] (HF rope layout); `frequencies` from
    rotary_frequencies for a scaled rotary."""
    inv_freq, scale = frequencies
    if inv_freq is None:
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
        )
    else:
        inv_freq = inv_freq.to(positions.device)
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [B, T, head_dim/2]
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    if scale == 1.0:
        return angles.cos().to(dtype), angles.sin().to(dtype)
    return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DrafterAttention(nn.Module):
    """Queries from the block; keys/values from [injected context; block]."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = nn.RMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(d, eps=config.rms_norm_eps)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, H] -> (k, v) each [B, kv_heads, T, head_dim], k rotated."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(k, cos, sin), v

    def forward(self, x, cos, sin, context_k, context_v, mask: BlockMask):
        """x [B, Q, H]; context_k/v [B, kv, T, d]. One block per request goes through dispatch.attention_op (the
        Triton kernel on CUDA, the torch twin elsewhere); packed training blocks through the dense torch math."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        block_k, block_v = self.project_kv(x, cos, sin)
        if mask.dense is not None:
            out = injected_attention(q, context_k, context_v, block_k, block_v, mask.dense)
        else:
            out = attention_op(q, context_k, context_v, block_k, block_v, mask.context_valid, mask.block_causal)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class DrafterMLP(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ShiftMix(nn.Module):
    """h_j <- W [h_j ; h_{j-1}] along the block (slot 0 sees zeros); starts as the identity."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.cat((torch.eye(hidden_size), torch.zeros(hidden_size, hidden_size)), dim=1))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, A, k, H] (A blocks of k slots) -> same shape."""
        previous = F.pad(h, (0, 0, 1, 0))[:, :, :-1]
        return F.linear(torch.cat((h, previous), dim=-1), self.weight)

    def mix_rows(self, rows: torch.Tensor, block_len: int) -> torch.Tensor:
        """The engines' layout: rows [N, H] holding each request's block of `block_len` slots contiguously (rows
        past the last whole block are padding, left to the engine) -> [N, H]."""
        count, hidden = rows.shape
        padded = F.pad(rows, (0, 0, 0, -count % block_len))
        blocks = padded.view(padded.shape[0] // block_len, 1, block_len, hidden)
        return self(blocks).view(padded.shape[0], hidden)[:count]


def grouped_causal_convolve(
    h: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, group_size: int
) -> torch.Tensor:
    """DFlash2's convolution along each block (z-lab `dflash` 0.1.0 `_grouped_dynamic_convolve`; speculators 0.9.0
    `grouped_dynamic_conv`): h [..., k, H], dynamic [..., k, K, G] (per slot, tap and channel group), base [K, H]
    -> out_j = sum_t (base[t] + dynamic[j, t]) * h_{j-t}, with h_{j-t} = 0 before the block's first slot."""
    *lead, k, hidden = h.shape
    taps, groups = base.shape[0], hidden // group_size
    blocks = h.reshape(*lead, k, groups, group_size)
    out = torch.zeros_like(blocks)
    for tap in range(taps):
        shifted = blocks if tap == 0 else F.pad(blocks[..., : max(k - tap, 0), :, :], (0, 0, 0, 0, min(tap, k), 0))
        coefficient = base[tap].to(h.dtype).view(groups, group_size) + dynamic[..., tap, :, None]
        out = out + coefficient * shifted
    return out.view_as(h)


class GroupedDynamicCausalConv(nn.Module):
    """DFlash2's `GroupedDynamicCausalConv` around one sublayer: `prepare` convolves the sublayer's input and keeps
    the output-side kernel, computed from the same input; `finish` convolves the sublayer's output with it. Both
    start as the identity (speculators 0.9.0 `reset_parameters`: base tap 0 = 1, the projection 0), so a new
    dflash2 drafter starts as DFlash."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        self.kernel_size, self.group_size, self.groups = kernel_size, group_size, hidden_size // group_size
        base = torch.zeros(2, kernel_size, hidden_size)
        base[:, 0] = 1.0
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def prepare(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h [..., k, H] -> (h convolved, the output-side dynamic kernel [..., k, K, G])."""
        dynamic = self.kernel_projection(h).view(*h.shape[:-1], 2, self.kernel_size, self.groups)
        convolved = grouped_causal_convolve(h, dynamic[..., 0, :, :], self.base_kernel[0], self.group_size)
        return convolved, dynamic[..., 1, :, :]

    def finish(self, h: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return grouped_causal_convolve(h, dynamic, self.base_kernel[1], self.group_size)


class DrafterLayer(nn.Module):
    def __init__(self, config: DrafterConfig, shift_mix: bool, sublayer_conv: bool = False) -> None:
        super().__init__()
        self.shift_mix = ShiftMix(config.hidden_size) if shift_mix else None
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DrafterAttention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = DrafterMLP(config)
        if sublayer_conv:  # DFlash2: a convolution along the block around each sublayer
            size, taps, group = config.hidden_size, config.variant.conv_kernel_size, config.variant.conv_group_size
            self.attention_conv = GroupedDynamicCausalConv(size, taps, group)
            self.mlp_conv = GroupedDynamicCausalConv(size, taps, group)
        else:
            self.attention_conv = self.mlp_conv = None

    def forward(self, h, cos, sin, context_k, context_v, mask: BlockMask):
        """h [B, A, k, H] -> [B, A, k, H]; the A*k block slots are the queries."""
        if self.shift_mix is not None:
            h = self.shift_mix(h)
        shape = h.shape
        x = h.reshape(shape[0], -1, shape[-1])
        attend = lambda y: self.self_attn(y, cos, sin, context_k, context_v, mask)  # noqa: E731
        x = x + self._around(self.attention_conv, attend, self.input_layernorm(x), shape)
        x = x + self._around(self.mlp_conv, self.mlp, self.post_attention_layernorm(x), shape)
        return x.view(shape)

    @staticmethod
    def _around(conv: GroupedDynamicCausalConv | None, sublayer, x: torch.Tensor, shape) -> torch.Tensor:
        """sublayer(x), or with DFlash2's convolution along the block around it (x [B, A*k, H], blocks of `shape`)."""
        if conv is None:
            return sublayer(x)
        convolved, dynamic = conv.prepare(x.view(shape))
        out = sublayer(convolved.reshape(x.shape))
        return conv.finish(out.view(shape), dynamic).reshape(x.shape)
