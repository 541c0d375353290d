"""A trained drafter rewritten wider than its target, drafting what it drafted: a drafter whose width differs from
the target's (own embedding and head, fc reading the target's width) with acceptance worth comparing, which random
weights of another width would not give.

Every hidden vector is the old one followed by zeros: linear maps are padded with zero rows/columns, the
embedding and head are the target's padded, and each RMSNorm weight is scaled by sqrt(H / W), since the mean
square over W dims is H / W of the mean over H. The one change is the norms' epsilon, which acts W / H times
larger (1e-6 against mean squares of order 1e-2 and up): logits agree to float rounding, not bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.nn import functional as F

from portable_spec.core.checkpoint import load_drafter_files, save_drafter
from portable_spec.core.drafter import target_ids_of
from portable_spec.core.spec import DrafterConfig
from portable_spec.core.target import TargetModel

# by module (the name's second-to-last part); q_norm / k_norm act per head and d2t maps ids: both unchanged
NORMS = ("hidden_norm", "norm", "input_layernorm", "post_attention_layernorm")
PADDED_COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # read the hidden vector
PADDED_ROWS = ("fc", "o_proj", "down_proj")  # write it


def _pad(tensor: torch.Tensor, rows: int = 0, columns: int = 0) -> torch.Tensor:
    """Zeros after the last column (a vector's last entry) and after the last row."""
    return F.pad(tensor, (0, columns) if tensor.dim() == 1 else (0, columns, 0, rows))


def _widen_one(name: str, tensor: torch.Tensor, hidden: int, width: int) -> torch.Tensor:
    extra, module = width - hidden, name.split(".")[-2] if "." in name else name
    if module in NORMS:
        return _pad(tensor * math.sqrt(hidden / width), columns=extra)
    if module in PADDED_COLUMNS:
        return _pad(tensor, columns=extra)
    if module in PADDED_ROWS:
        return _pad(tensor, rows=extra)
    if module == "shift_mix":  # [H, 2H] over [h_j ; h_{j-1}] -> [W, 2W] over the padded pair
        current, previous = tensor[:, :hidden], tensor[:, hidden:]
        return _pad(torch.cat((_pad(current, columns=extra), _pad(previous, columns=extra)), dim=1), rows=extra)
    return tensor


def widened(source: Path, target: TargetModel, out: Path, width: int) -> Path:
    """The portable drafter at `source` (of the target's width, sharing its embedding and head) saved to `out`
    `width` wide, with own_embeddings."""
    config, weights = load_drafter_files(source)
    hidden = config.hidden_size
    if config.own_embeddings or width <= hidden:
        raise ValueError(f"{source}: widening takes a drafter sharing the target's embedding to a width > {hidden}")
    wide = {name: _widen_one(name, tensor, hidden, width) for name, tensor in weights.items()}
    dtype = weights["fc.weight"].dtype
    rows = None if config.draft_vocab_size is None else target_ids_of(weights["d2t"])
    wide |= {name: _pad(t, columns=width - hidden) for name, t in target.embedding_and_head(rows).items()}
    wide = {name: tensor.to(dtype) if tensor.is_floating_point() else tensor for name, tensor in wide.items()}
    wider = DrafterConfig.model_validate({**config.model_dump(), "hidden_size": width, "own_embeddings": True})
    return save_drafter(out, wider, wide)
