"""A sequential head's slot step and the chain that runs it: how a dflash2, dspark or domino drafter turns one block
pass's final states and logits into drafts, slot after slot, each slot given the draft before it.

The step is one slot's function of (the slot's state `hidden` [B, H], the slot's block logits over the target
vocabulary `logits` [B, V], the token before the slot `previous` [B], the head's recurrent state [B, S]) ->
(the logits the slot's draft is picked from [B, V], the next recurrent state [B, S], and for a dspark with a
confidence head its predicted acceptance [B]). It is a module so that the reference decoder and the exported ONNX
step graph (adapters/onnx_export.py) run one function; `chain_drafts` is the loop both run it in:

  selector (dflash2, selector.py)  the slot's candidates re-scored by the bigram codebooks, -inf outside them
  markov   (dspark, markov.py)     the logits plus the Markov bias; the rnn head's state is its recurrence
  domino   (domino.py)             the logits plus the GRU correction; the state is the GRU's

Stateless heads pass their state through unchanged (S = 1), so every step has the same inputs and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from portable_spec.core.domino import step_correction
from portable_spec.core.markov import confidence_input
from portable_spec.core.sampling import greedy_with_probability
from portable_spec.core.spec import DrafterConfig


@dataclass(frozen=True)
class ChainSlots:
    """Which block slots a chain runs (`first` .. the last draft slot), where the drafts start (`first_draft`), and
    the first slot whose draft takes the step's logits (`first_corrected`; before it the block logits stand)."""

    first: int
    first_draft: int
    first_corrected: int
    state_size: int


def chain_slots(config: DrafterConfig) -> ChainSlots:
    """The chain's slots for a drafter config: DSpark's Markov recurrence runs from the block's slot 0 whatever
    slot drafts first (markov.py); Domino leaves its first pure_draft_prefix_len drafts uncorrected (domino.py)."""
    variant = config.variant
    first_draft = 0 if config.drafts_from_anchor else 1
    if variant.behaviour.markov_head:
        state = variant.markov_rank if variant.markov_head_type == "rnn" else 1
        return ChainSlots(0, first_draft, first_draft, state)
    if variant.behaviour.gru_head:
        return ChainSlots(first_draft, first_draft, first_draft + variant.pure_draft_prefix_len, variant.gru_hidden_dim)
    return ChainSlots(first_draft, first_draft, first_draft, 1)


class SlotStep(Protocol):
    """One slot of a sequential head (a HeadStep, or the ONNX step graph): (hidden [B, H], logits [B, V],
    previous [B], state [B, S]) -> (logits [B, V], next state [B, S], predicted acceptance [B] or None)."""

    def __call__(
        self, hidden: torch.Tensor, logits: torch.Tensor, previous: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]: ...


class HeadStep(nn.Module):
    """A drafter's sequential head as one slot's step; holds the drafter's head modules (not registered in the
    drafter: built per call by Drafter.head_step)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.slots = chain_slots(config)

    def initial_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """The state before the chain's first slot: zeros [B, S] (a GRU's and the rnn Markov head's start)."""
        return hidden.new_zeros(hidden.shape[0], self.slots.state_size, dtype=self.state_dtype())

    def state_dtype(self) -> torch.dtype:
        return torch.float32


class SelectorStep(HeadStep):
    """DFlash2: the slot's top-k candidates scored unary + bigram given `previous` (selector.py), -inf elsewhere:
    greedy picks the best candidate, and at T > 0 the draft is drawn from the candidates' scores at the request's
    temperature (z-lab `dflash` 0.1.0 `CandidateSelector.select` samples softmax(scores / T); the request's top-k and
    top-p apply here too), q zero outside the candidates."""

    def __init__(self, config: DrafterConfig, selector: nn.Module) -> None:
        super().__init__(config)
        self.selector = selector

    def forward(self, hidden, logits, previous, state):
        unary, candidates = self.selector.candidates(logits)
        projected = self.selector.hidden_projection(hidden)
        scores = unary.float() + self.selector.transition_scores(projected, previous, candidates).float()
        full = scores.new_full(logits.shape, float("-inf"))
        return full.scatter(-1, candidates, scores), state, None


class MarkovStep(HeadStep):
    """DSpark: the logits plus the Markov bias of `previous` (scattered to the target ids of a draft vocabulary),
    and the confidence head's sigmoid where the drafter has one."""

    def __init__(self, config: DrafterConfig, head: nn.Module, confidence: nn.Module | None, ids) -> None:
        super().__init__(config)
        self.head, self.confidence, self.with_markov = head, confidence, config.variant.confidence_head_with_markov
        self.register_buffer("draft_ids", ids, persistent=False)  # None: the full vocabulary

    def state_dtype(self) -> torch.dtype:
        return self.head.markov_w2.weight.dtype

    def forward(self, hidden, logits, previous, state):
        embedding = self.head.embed(previous)
        recurrent = state if self.head.head_type == "rnn" else None
        next_state, bias = self.head.step(recurrent, embedding, hidden)
        if self.draft_ids is not None:
            bias = bias.new_zeros(logits.shape).scatter(-1, self.draft_ids.expand(*bias.shape[:-1], -1), bias)
        acceptance = None
        if self.confidence is not None:
            acceptance = torch.sigmoid(self.confidence(confidence_input(hidden, embedding, self.with_markov)).float())
        return logits + bias, state if next_state is None else next_state, acceptance


class DominoStep(HeadStep):
    """Domino: the logits plus the correction from the GRU's step over the embedding of `previous`."""

    def __init__(self, config: DrafterConfig, gru: nn.GRU, proj: nn.Module, embed_tokens: nn.Module, dtype) -> None:
        super().__init__(config)
        self.gru, self.proj, self.embed_tokens, self.dtype = gru, proj, embed_tokens, dtype

    def state_dtype(self) -> torch.dtype:
        return self.gru.weight_ih_l0.dtype

    def forward(self, hidden, logits, previous, state):
        embedding = self.embed_tokens(previous).to(self.dtype)
        next_state, correction = step_correction(self.gru, self.proj, state[None], embedding, hidden)
        return logits + correction, next_state[0], None


def chain_drafts(
    step: SlotStep,
    slots: ChainSlots,
    hidden: torch.Tensor,  # [B, >= last draft slot + 1, H]: one block's final states
    logits: torch.Tensor,  # [B, slots from slots.first on, V]: their block logits (none scored before the chain)
    anchor_tokens: torch.Tensor,  # [B]
    num_drafts: int,
    state: torch.Tensor,  # [B, S]: the step's initial state
    sampler=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(drafts [B, n], each one's probability [B, n], the q [B, n, V] they were drawn from or None): each slot's draft
    picked greedily, or drawn by `sampler` (sampling.DraftSampler), from the step's logits given the draft before;
    the probability is the step's predicted acceptance where it has one (DSpark's confidence head, trained for
    cutting the draft where the cumulative product falls), else q's."""
    previous, drafts, probabilities, qs = anchor_tokens, [], [], []
    for slot in range(slots.first, slots.first_draft + num_drafts):
        block_logits = logits[:, slot - slots.first]
        scores, state, acceptance = step(hidden[:, slot], block_logits, previous, state)
        if slot < slots.first_draft:  # DSpark's slot 0 predicts the anchor itself: it only feeds the recurrence
            continue
        if slot < slots.first_corrected:  # Domino's pure-draft prefix: the block's own logits
            scores = block_logits
        token, probability, q = pick_draft(scores, sampler, slot - slots.first_draft)
        drafts.append(token)
        probabilities.append(probability if acceptance is None else acceptance)
        qs.append(q)
        previous = token
    q = torch.stack(qs, dim=1) if sampler is not None else None
    return torch.stack(drafts, dim=1), torch.stack(probabilities, dim=1), q


def pick_draft(logits: torch.Tensor, sampler, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One draft of a chain from its logits [B, V]: (tokens [B], their probability [B], the q they were drawn from
    [B, V] or None): greedy (the softmax probability), or by `sampler` (sampling.DraftSampler)."""
    if sampler is None:
        token, probability = greedy_with_probability(logits[:, None])
        return token[:, 0], probability[:, 0], None
    token, q = sampler(index, logits)
    return token, q.gather(-1, token[:, None])[:, 0], q
