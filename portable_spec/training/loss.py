"""The drafter's training loss: random anchors per sequence, the draft predicting token anchor+i (block slot i, or
i - 1 when the anchor's slot drafts: Drafter.prediction_slot) weighted exp(-(i-1)/gamma) (DFlash's loss decay,
z-lab/dflash 0.1.0; speculators 0.9.0's dflash_loss_decay gives the same weight per offset either way). Shared by the training loop and the held-out
acceptance (heldout.py), which reads the same teacher-forced blocks.

A dflash2 drafter adds its candidate selector's loss, as vllm-project/speculators 0.9.0 trains it
(models/dflash2/core.py `forward`, metrics.py `compute_selector_loss`, `selector_loss_alpha` 1.0): each slot's
candidates are its top-k logits (the serving set; the true token replaces the last one when it is not among
them), their scores unary + bigram term given the true token before (teacher-forced), and the loss a k-way
cross-entropy on the true token's rank, weighted as the unary loss.

A dspark drafter's logits carry its Markov bias given the true token before each slot, and its confidence head adds
a binary cross-entropy against each slot's acceptance rate (confidence_losses; speculators 0.9.0
models/dspark/core.py `forward`, metrics.py, `confidence_head_alpha` 1.0).

A domino drafter's logits carry its GRU correction given the true tokens before each slot; the loss is their
cross-entropy. SpecForge 0.2.0 (algorithms/common/dflash_family_model.py `OnlineDominoModel.forward`) also mixes in
the uncorrected logits' cross-entropy with a weight falling from 1 to 0 over the first half of its steps
(`lambda_base_start` 1.0, `lambda_base_decay_ratio` 0.5); that schedule needs the run's total steps, which a
time-budgeted run does not have, and is not done here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from portable_spec.core.drafter import Drafter


def teacher_forced_blocks(
    drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's teacher-forced blocks at many anchors in one pass: features [B, T, F] of tokens [B, T'] (T' >= T,
    every anchor + label_span <= T'), anchors [B, A] -> (final hidden states of every block slot [B, A, k, H], the
    true tokens from each anchor on [B, A, label_span]: the anchor, then the label of each draft offset). Block j's
    context is every position before its anchor, as in decoding; what training and the held-out acceptance share."""
    config, batch = drafter.config, tokens.shape[0]
    k, num_anchors, context_len = config.block_size, anchors.shape[1], features.shape[1]
    positions = torch.arange(context_len, device=tokens.device).expand(batch, -1)
    span = anchors[:, :, None] + torch.arange(config.label_span, device=tokens.device)  # [B, A, label_span]
    true_tokens = tokens.gather(1, span.reshape(batch, -1)).view(batch, num_anchors, config.label_span)
    if drafter.behaviour.autoregressive:
        block_ids = true_tokens[..., :k]
    else:
        block_ids = torch.full_like(true_tokens[..., :k], config.mask_token_id)
        block_ids[..., 0] = true_tokens[..., 0]
    context_mask = (positions[:, None, :] < anchors[:, :, None]).repeat_interleave(k, dim=1)  # [B, A*k, T]
    context = drafter.context_kv(features, positions)
    hidden = drafter.block_hidden(block_ids, span[..., :k], context, context_mask, positions)
    return hidden, true_tokens


def block_predictions(
    drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """As teacher_forced_blocks, with the draft slots' teacher-forced logits [B, A, max_draft_tokens, V_draft]
    (Drafter.teacher_forced_logits) in place of the hidden states."""
    hidden, true_tokens = teacher_forced_blocks(drafter, features, tokens, anchors)
    return drafter.teacher_forced_logits(hidden, true_tokens), true_tokens


def drafter_loss(
    drafter: Drafter,
    features: torch.Tensor,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    gamma: float,
    selector: bool = True,
):
    """features [B, T, F] of tokens [B, T], anchors [B, A] (each <= T - label_span) -> weighted cross-entropy over
    draft offsets. With a reduced draft vocabulary, tokens outside it carry no loss (they can never be drafted).
    A dflash2's selector loss is added unless `selector` is false (--depthwise-shift-mix holds the selector)."""
    batch, num_anchors, n = tokens.shape[0], anchors.shape[1], drafter.config.max_draft_tokens
    hidden, true_tokens = teacher_forced_blocks(drafter, features, tokens, anchors)
    predicted = drafter.teacher_forced_logits(hidden, true_tokens)  # [B, A, n, V_draft]
    labels = true_tokens[..., 1:]
    if drafter.config.draft_vocab_size is not None:
        labels = target_to_draft(drafter, labels)
    losses = F.cross_entropy(predicted.flatten(0, 2), labels.flatten(), reduction="none", ignore_index=-100)
    weights = torch.exp(-torch.arange(n, dtype=torch.float32, device=tokens.device) / gamma)
    draft_hidden = hidden[..., drafter.draft_slots(n), :]
    if drafter.behaviour.candidate_selector and selector:
        losses = losses + SELECTOR_LOSS_ALPHA * selector_losses(drafter, draft_hidden, predicted, true_tokens).flatten()
    if hasattr(drafter, "confidence_head"):
        losses = losses + CONFIDENCE_LOSS_ALPHA * confidence_losses(
            drafter, draft_hidden, predicted, true_tokens, labels
        )
    return (losses.view(batch, num_anchors, n) * weights).sum() / (weights.sum() * batch * num_anchors)


CONFIDENCE_LOSS_ALPHA = 1.0  # speculators 0.9.0 DSpark get_trainer_kwargs' confidence_head_alpha default


def confidence_losses(
    drafter: Drafter, hidden: torch.Tensor, logits: torch.Tensor, true_tokens: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """A dspark's confidence-head loss per draft slot, flat [B * A * n]: binary cross-entropy of its predicted
    acceptance against the slot's acceptance rate sum_v min(q_v, p_v) (speculators 0.9.0 models/dspark/metrics.py),
    detached. The target's distribution p is not cached here: the replies are the target's own tokens, so p is
    one-hot on the label and the rate is q(label), the drafter's probability of the true token (0 outside a
    draft vocabulary). hidden [B, A, n, H] and logits [B, A, n, V_draft] of the draft slots, labels [B, A, n] in
    the draft vocabulary (-100 outside it)."""
    with torch.no_grad():
        q = logits.float().softmax(dim=-1)
        rate = q.gather(-1, labels.clamp(min=0)[..., None])[..., 0] * (labels >= 0)
    confidence = drafter.confidence_logits(hidden, true_tokens[..., :-1])
    return F.binary_cross_entropy_with_logits(confidence.float(), rate, reduction="none").flatten()


SELECTOR_LOSS_ALPHA = 1.0  # speculators 0.9.0 DFlash2 get_trainer_kwargs' selector_loss_alpha default


def selector_losses(
    drafter: Drafter, hidden: torch.Tensor, logits: torch.Tensor, true_tokens: torch.Tensor
) -> torch.Tensor:
    """A dflash2's selector cross-entropy per draft slot [B, A, n]: hidden [B, A, n, H] and logits [..., V] of the
    draft slots, true_tokens [B, A, n + 1] (the anchor, then each slot's target)."""
    selector = drafter.candidate_selector
    targets, predecessors = true_tokens[..., 1:], true_tokens[..., :-1]
    candidates = selector.candidates(logits)[1]  # the serving candidate set
    present = candidates.eq(targets[..., None])
    found = present.any(dim=-1)
    label = torch.where(found, present.to(torch.int64).argmax(dim=-1), selector.top_k - 1)
    candidates = candidates.clone()
    candidates[..., -1] = torch.where(found, candidates[..., -1], targets)  # the target at rank K when absent
    scores = (
        logits.gather(-1, candidates).float()
        + selector.transition_scores(selector.hidden_projection(hidden), predecessors, candidates).float()
    )
    return F.cross_entropy(scores.flatten(0, -2), label.flatten(), reduction="none").view_as(label)


def target_to_draft(drafter: Drafter, target_ids: torch.Tensor) -> torch.Tensor:
    """Target ids -> draft-vocabulary indices, -100 (ignored by the loss) where outside the draft vocabulary."""
    lookup = torch.full((drafter.config.vocab_size,), -100, dtype=torch.int64, device=target_ids.device)
    draft_ids = drafter.draft_token_ids().to(target_ids.device)
    lookup[draft_ids] = torch.arange(len(draft_ids), device=target_ids.device)
    return lookup[target_ids]


class DrafterLoss(torch.nn.Module):
    """The drafter's training loss as a module's forward, which DistributedDataParallel needs to sync gradients."""

    def __init__(self, drafter: Drafter, gamma: float, selector: bool = True) -> None:
        super().__init__()
        self.drafter, self.gamma, self.selector = drafter, gamma, selector

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        return drafter_loss(self.drafter, features, tokens, anchors, self.gamma, self.selector)
