"""DSpark's Markov and confidence heads: how a dspark drafter biases each slot by the token before it.

As vllm-project/speculators 0.9.0 computes them (models/dspark/model_definitions.py `MarkovHead`,
`ConfidenceHead`; core.py `DSparkDraftModel.forward`): slot s's logits gain a bias from `prev_s`, the token before
the one it predicts (the anchor for the first draft slot; teacher-forced in training, the previous slot's draft when
decoding):

    vanilla  W2 W1[prev_s]
    gated    W2 (sigmoid(G [h_s ; W1[prev_s]]) * W1[prev_s])
    rnn      state_s = g * state_{s-1} + (1 - g) * tanh(c),  bias_s = W2 tanh(o),  [g; c; o] = J [state_{s-1};
             W1[prev_s]; h_s], g through a sigmoid, state_{-1} = 0

with W1 indexed by target ids and W2 scoring the drafter's (draft) vocabulary. The recurrence runs from the block's
slot 0 whatever slot drafts first: with sample_from_anchor false speculators feeds slot 0 the anchor as its
previous token and slot 1 the anchor again, and so does this. The confidence head maps [h_s ; W1[prev_s]] (or h_s)
to one logit, the predicted acceptance of slot s. The parameter names are speculators' (`markov_head.markov_w1`,
`confidence_head.proj`, ...).
"""

from __future__ import annotations

import torch
from torch import nn


class MarkovHead(nn.Module):
    def __init__(self, vocab_size: int, scored_vocab_size: int, rank: int, hidden_size: int, head_type: str) -> None:
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        nn.init.normal_(self.markov_w1.weight, std=0.01)  # speculators 0.9.0's initialisation
        self.markov_w2 = nn.Linear(rank, scored_vocab_size, bias=False)
        if head_type == "gated":
            self.gate_proj = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        """Previous-token ids [...] -> their W1 rows [..., R]."""
        return self.markov_w1(prev)

    def step(
        self, state: torch.Tensor | None, prev_embedding: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One slot: (state [..., R] or None at the block's start, W1[prev] [..., R], h [..., H]) -> (the next state,
        the slot's bias [..., V_scored]). Only the rnn head keeps a state."""
        prev_embedding = prev_embedding.to(self.markov_w2.weight.dtype)
        if self.head_type == "vanilla":
            return None, self.markov_w2(prev_embedding)
        hidden = hidden.to(prev_embedding.dtype)
        if self.head_type == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat((hidden, prev_embedding), dim=-1)))
            return None, self.markov_w2(gate * prev_embedding)
        if state is None:
            state = prev_embedding.new_zeros(*prev_embedding.shape[:-1], self.rank)
        gate, candidate, output = self.joint_proj(torch.cat((state, prev_embedding, hidden), dim=-1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return state, self.markov_w2(torch.tanh(output))

    def block_bias(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced: previous-token ids [..., k] and slot states [..., k, H] of whole blocks -> biases
        [..., k, V_scored]; vanilla and gated in one step, rnn slot after slot."""
        embedding = self.embed(prev)
        if self.head_type != "rnn":
            return self.step(None, embedding, hidden)[1]
        state, biases = None, []
        for slot in range(prev.shape[-1]):
            state, bias = self.step(state, embedding[..., slot, :], hidden[..., slot, :])
            biases.append(bias)
        return torch.stack(biases, dim=-2)


class ConfidenceHead(nn.Module):
    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[..., input_size] -> the predicted acceptance's logit [...]."""
        return self.proj(features).squeeze(-1)


def confidence_input(hidden: torch.Tensor, prev_embedding: torch.Tensor, with_markov: bool) -> torch.Tensor:
    """What the confidence head reads: [h_s ; W1[prev_s]] (speculators' confidence_head_with_markov) or h_s."""
    return torch.cat((hidden, prev_embedding.to(hidden.dtype)), dim=-1) if with_markov else hidden


def previous_tokens(block_tokens: torch.Tensor, drafts_from_anchor: bool) -> torch.Tensor:
    """Block tokens [..., k] (the anchor, then the tokens after it) -> each slot's previous token [..., k]: the token
    before the one the slot predicts (with drafts_from_anchor false, slot 0 predicts the anchor itself and takes
    the anchor; speculators 0.9.0 DSparkDraftModel.forward)."""
    if drafts_from_anchor:
        return block_tokens
    return torch.cat((block_tokens[..., :1], block_tokens[..., :-1]), dim=-1)
