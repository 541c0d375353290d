"""The drafter a run trains, made concrete for its target: the DrafterConfig from the run's drafter section (feature
layers, mask token, draft vocabulary size defaulted from the target), checked to fit the device before anything is
allocated."""

from __future__ import annotations

import torch

from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel, drafter_config_for
from portable_spec.core.variants import behaviour_of
from portable_spec.training.config import DrafterShape
from portable_spec.training.features import device_memory


def dflash_target_layer_ids(num_target_layers: int, num_feature_layers: int) -> list[int]:
    """DFlash's choice (z-lab/dflash build_target_layer_ids): spread evenly over [1, L - 3]; the middle for one.
    A target too shallow for that many distinct layers there spreads over every usable layer, [0, L - 2]."""
    if num_feature_layers == 1:
        return [num_target_layers // 2]
    for start, end in ((1, num_target_layers - 3), (0, num_target_layers - 2)):
        ids = [int(round(start + i * (end - start) / (num_feature_layers - 1))) for i in range(num_feature_layers)]
        if end > start and len(set(ids)) == len(ids):
            return ids
    raise SpecError(
        f"a {num_target_layers}-layer target has fewer than {num_feature_layers} usable feature layers "
        f"(0..{num_target_layers - 2}); use --num-hidden-layers {max(num_target_layers - 1, 1)} or fewer, or pass "
        "--target-layer-ids"
    )


def mask_token_for(tokenizer, embedding_rows: int) -> int:
    """The tokenizer's mask token; else, as DFlash checkpoints for Qwen do, the first embedding row no token uses;
    else (a tokenizer that fills its embedding, as SmolLM2's) its unknown / <|endoftext|> token, rare in chat data."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < embedding_rows:
        return len(tokenizer)
    for token_id in (tokenizer.unk_token_id, tokenizer.bos_token_id):
        if token_id is not None:
            return int(token_id)
    raise SpecError(
        "the tokenizer has no mask, unknown or BOS token and no spare embedding row; "
        "pass --mask-token-id with a token id that never appears in replies"
    )


def build_config(target: TargetModel, tokenizer, shape: DrafterShape, model_id: str) -> DrafterConfig:
    layer_ids = shape.target_layer_ids or dflash_target_layer_ids(
        target.config.num_hidden_layers, shape.num_hidden_layers
    )
    rows = target.vocab_size
    mask = shape.mask_token_id if shape.mask_token_id is not None else mask_token_for(tokenizer, rows)
    draft_vocab = shape.draft_vocab_size
    full = behaviour_of(shape.kind).full_vocabulary  # dflash2, domino score every token (config.DrafterShape says so)
    if full or not draft_vocab or draft_vocab >= rows:  # 0, or the default (8192) on a small vocabulary: all
        draft_vocab = None
    return drafter_config_for(
        target,
        kind=shape.kind,
        block_size=shape.block_size,
        num_hidden_layers=shape.num_hidden_layers,
        target_layer_ids=layer_ids,
        mask_token_id=mask,
        intermediate_size=shape.intermediate_size,
        draft_vocab_size=draft_vocab,
        model_id=model_id,
        variant_options=shape.variant_options(),
    )


TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and AdamW's two moments


def check_trainable_size(config: DrafterConfig, device: torch.device) -> None:
    """The drafter's weights, gradients and optimizer state fit the device (counted on the meta device, before
    anything is allocated), else one line naming the flags that size it."""
    with torch.device("meta"):
        parameters = sum(p.numel() for p in Drafter(config).parameters())
    needed, memory = parameters * TRAINING_BYTES_PER_PARAMETER, device_memory(device)
    if needed > memory:
        raise SpecError(
            f"the drafter has {parameters:,} parameters (--num-hidden-layers {config.num_hidden_layers}, "
            f"--intermediate-size {config.intermediate_size}): training needs {needed / 2**30:,.0f} GiB for its "
            f"weights, gradients and optimizer, more than {device}'s {memory / 2**30:,.0f} GiB; lower them"
        )
