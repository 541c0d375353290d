"""The drafter's attention math, as the torch reference: block queries over [injected context; block] keys and
values, and the masks that say which keys each block slot sees. `dispatch.attention_op` picks between this and
the Triton kernel; the drafter's layers call it through `BlockMask`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class BlockMask:
    """Which keys each block query sees, in one of two forms:
    - one block per request (decoding): `context_valid` [B, T] bool plus the variant's `block_causal`, the form
      `dispatch.attention_op` takes (the Triton kernel on CUDA);
    - `dense` [B, 1, Q, T+Q] bool (training packs many blocks per row, each with its own context cut)."""

    context_valid: torch.Tensor | None = None
    block_causal: bool = False
    dense: torch.Tensor | None = None


def injected_attention(
    q: torch.Tensor,  # [B, H, Q, d], normed and rotated
    context_k: torch.Tensor,  # [B, kv_heads, T, d]
    context_v: torch.Tensor,  # [B, kv_heads, T, d]
    block_k: torch.Tensor,  # [B, kv_heads, Q, d]
    block_v: torch.Tensor,  # [B, kv_heads, Q, d]
    mask: torch.Tensor,  # [B, 1, Q, T+Q] bool, True = may attend
) -> torch.Tensor:  # [B, H, Q, d]
    """Block queries attend to [injected context; block] keys/values (GQA: kv heads repeated).

    The torch twin of portable_spec/kernels/attention_triton.py (with the mask from `block_attention_mask`).
    """
    k = torch.cat((context_k, block_k), dim=2)
    v = torch.cat((context_v, block_v), dim=2)
    groups = q.shape[1] // context_k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def within_block_mask(block_size: int, block_causal: bool, num_blocks: int = 1, device=None) -> torch.Tensor:
    """[A*k, A*k] bool: which block slots each block slot sees; blocks never see each other (training packs A
    blocks per row), and inside a block every slot sees every slot unless the variant is block-causal."""
    within = torch.ones(block_size, block_size, dtype=torch.bool, device=device)
    if block_causal:
        within = within.tril()
    return torch.block_diag(*([within] * num_blocks)) if num_blocks > 1 else within


def window_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[B, Q] query and [B, T] key positions -> [B, Q, T] bool: the key lies less than `window` positions behind
    the query (transformers, z-lab dflash 0.1.0, SpecForge 0.2.0, vLLM: q_pos - k_pos < window; keys ahead are
    cut by the caller's context mask, never by the window)."""
    return (query_positions[:, :, None] - key_positions[:, None, :]) < window


def anchor_window_mask(anchor_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[B, Q] each query's block anchor and [B, T] key positions -> [B, Q, T] bool: the key lies at most `window`
    positions behind the anchor, the same keys for every slot of a block (speculators 0.9.0's trainer,
    models/dflash/attention.py `base_prefix_mod`: kv_pos >= anchor - window)."""
    return key_positions[:, None, :] >= anchor_positions[:, :, None] - window


def block_attention_mask(context_valid: torch.Tensor, block_size: int, block_causal: bool) -> torch.Tensor:
    """Mask for one block per request: context_valid [B, T] bool -> [B, 1, k, T+k] (causal or full in the block)."""
    within = within_block_mask(block_size, block_causal, device=context_valid.device)
    context = context_valid[:, None, :].expand(-1, block_size, -1)
    return torch.cat((context, within.expand(context_valid.shape[0], -1, -1)), dim=-1)[:, None]
