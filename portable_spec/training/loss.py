"""The drafter's training loss: random anchors per sequence, block slot i predicting token anchor+i, weighted
exp(-(i-1)/gamma) (DFlash's loss decay, z-lab/dflash 0.1.0). Shared by the training loop and the held-out
acceptance (heldout.py), which reads the same teacher-forced blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from portable_spec.core.drafter import Drafter


def block_predictions(
    drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's teacher-forced blocks at many anchors in one pass: features [B, T, F] of tokens [B, T'] (T' >= T,
    every anchor + block_size <= T'), anchors [B, A] -> (draft-vocabulary logits [B, A, k-1, V_draft] for offsets
    1..k-1, the true block tokens [B, A, k]). Block j's context is every position before its anchor, as in
    decoding; what training and the held-out acceptance share."""
    config, batch = drafter.config, tokens.shape[0]
    k, num_anchors, context_len = config.block_size, anchors.shape[1], features.shape[1]
    positions = torch.arange(context_len, device=tokens.device).expand(batch, -1)
    block_positions = anchors[:, :, None] + torch.arange(k, device=tokens.device)  # [B, A, k]
    true_tokens = tokens.gather(1, block_positions.reshape(batch, -1)).view(batch, num_anchors, k)
    if drafter.behaviour.autoregressive:
        block_ids = true_tokens
    else:
        block_ids = torch.full_like(true_tokens, config.mask_token_id)
        block_ids[..., 0] = true_tokens[..., 0]
    context_mask = (positions[:, None, :] < anchors[:, :, None]).repeat_interleave(k, dim=1)  # [B, A*k, T]
    context = drafter.context_kv(features, positions)
    hidden = drafter.block_hidden(block_ids, block_positions, context, context_mask, positions)
    slots = [drafter.prediction_slot(offset) for offset in range(1, k)]
    return drafter.scored_logits(hidden[:, :, slots]), true_tokens


def drafter_loss(drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, gamma: float):
    """features [B, T, F] of tokens [B, T], anchors [B, A] (each <= T - block_size) -> weighted cross-entropy over
    draft offsets. With a reduced draft vocabulary, tokens outside it carry no loss (they can never be drafted)."""
    batch, num_anchors, k = tokens.shape[0], anchors.shape[1], drafter.config.block_size
    predicted, true_tokens = block_predictions(drafter, features, tokens, anchors)  # [B, A, k-1, V_draft]
    labels = true_tokens[..., 1:]
    if drafter.config.draft_vocab_size is not None:
        labels = target_to_draft(drafter, labels)
    losses = F.cross_entropy(predicted.flatten(0, 2), labels.flatten(), reduction="none", ignore_index=-100)
    weights = torch.exp(-torch.arange(k - 1, dtype=torch.float32, device=tokens.device) / gamma)
    return (losses.view(batch, num_anchors, k - 1) * weights).sum() / (weights.sum() * batch * num_anchors)


def target_to_draft(drafter: Drafter, target_ids: torch.Tensor) -> torch.Tensor:
    """Target ids -> draft-vocabulary indices, -100 (ignored by the loss) where outside the draft vocabulary."""
    lookup = torch.full((drafter.config.vocab_size,), -100, dtype=torch.int64, device=target_ids.device)
    draft_ids = drafter.draft_token_ids().to(target_ids.device)
    lookup[draft_ids] = torch.arange(len(draft_ids), device=target_ids.device)
    return lookup[target_ids]


class DrafterLoss(torch.nn.Module):
    """The drafter's training loss as a module's forward, which DistributedDataParallel needs to sync gradients."""

    def __init__(self, drafter: Drafter, gamma: float) -> None:
        super().__init__()
        self.drafter, self.gamma = drafter, gamma

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        return drafter_loss(self.drafter, features, tokens, anchors, self.gamma)
