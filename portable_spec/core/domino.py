"""Domino's correction head: how a domino drafter corrects each slot's logits from the tokens before it in the block.

As SpecForge 0.2.0 computes it (specforge/modeling/draft/domino.py `DominoDraftModel.apply_logits_head` and
`_sample_draft_tokens`, `shift_label` false): a GRU without biases runs over the target's embeddings of the block's
tokens from the anchor on, and slot s (>= 1 + pure_draft_prefix_len) adds

    embed_proj([h_s ; g_{s-1}]),  embed_proj = Linear(H + G, E) -> SiLU -> Linear(E, V),  g_{s-1} = GRU(e_0 .. e_{s-1})

to its logits (teacher-forced in training, the drafts so far when decoding); slots 1 .. pure_draft_prefix_len keep
DFlash's logits. The parameter names are SpecForge's (`prefix_gru.weight_ih_l0`, `embed_proj.0.weight`, ...), at
the top level of the drafter as there.
"""

from __future__ import annotations

import torch
from torch import nn


def domino_modules(hidden_size: int, vocab_size: int, emb_dim: int, gru_hidden_dim: int) -> tuple[nn.GRU, nn.Module]:
    """(prefix_gru, embed_proj) shaped as SpecForge 0.2.0's `_init_draft_head` makes them."""
    gru = nn.GRU(input_size=hidden_size, hidden_size=gru_hidden_dim, num_layers=1, batch_first=True, bias=False)
    proj = nn.Sequential(
        nn.Linear(hidden_size + gru_hidden_dim, emb_dim, bias=False),
        nn.SiLU(),
        nn.Linear(emb_dim, vocab_size, bias=False),
    )
    return gru, proj


def block_corrections(
    gru: nn.GRU, proj: nn.Module, previous: torch.Tensor, hidden: torch.Tensor, prefix_len: int
) -> torch.Tensor:
    """Teacher-forced: the target's embeddings of each block's tokens from the anchor on [N, k - 1, H_emb] (the
    anchor .. the token before the last slot's) and the slot states [N, k, H] -> the corrections of slots 1 .. k-1
    [N, k - 1, V], zero for the first prefix_len of them."""
    states = gru(previous.to(gru.weight_ih_l0.dtype))[0]  # [N, k - 1, G]: state after e_0 .. e_{s-1}, slot s
    corrections = proj(torch.cat((hidden[:, 1:].to(states.dtype), states), dim=-1))
    if prefix_len:
        corrections = torch.cat((torch.zeros_like(corrections[:, :prefix_len]), corrections[:, prefix_len:]), dim=1)
    return corrections


def step_correction(
    gru: nn.GRU, proj: nn.Module, state: torch.Tensor | None, embedding: torch.Tensor, hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One slot when decoding: the GRU state so far [1, N, G] (None at the anchor), the embedding of the token before
    the slot [N, H_emb], the slot's state [N, H] -> (the next GRU state, the slot's correction [N, V])."""
    output, state = gru(embedding[:, None].to(gru.weight_ih_l0.dtype), state)
    return state, proj(torch.cat((hidden.to(output.dtype), output[:, 0]), dim=-1))
