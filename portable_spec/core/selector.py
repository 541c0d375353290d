"""DFlash2's candidate selector: how a dflash2 drafter turns its block logits into drafts.

As z-lab `dflash` 0.1.0 (dflash/model.py `CandidateSelector.select`) and vllm-project/speculators 0.9.0
(models/dflash2/model_definitions.py `CandidateSelector`) compute it: each draft slot's top-k logits are its
candidates (their logits the unary scores); slot after slot, a candidate c scores

    unary(c) + < predecessor_codebook[prev] * hidden_projection(h_slot), successor_codebook[c] >

where `prev` is the token picked in the slot before (the anchor for the first slot), and the best-scoring candidate
is the slot's draft. The codebooks are indexed by target token ids, so the drafter scores the full vocabulary.
The parameter names are the ones both projects save (`candidate_selector.predecessor_codebook`, ...). The pick,
slot after slot, is head_step.py's SelectorStep in its chain.
"""

from __future__ import annotations

import torch
from torch import nn


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        for weight in (self.predecessor_codebook, self.successor_codebook, self.hidden_projection.weight):
            nn.init.normal_(weight, std=0.02)  # speculators 0.9.0's initializer_range

    def candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, n, V] -> (unary scores [B, n, K], candidate ids [B, n, K]): each slot's top-k."""
        return torch.topk(logits, self.top_k, dim=-1)

    def transition_scores(
        self, projected: torch.Tensor, predecessor: torch.Tensor, candidates: torch.Tensor
    ) -> torch.Tensor:
        """projected [..., R] (slots' hidden_projection), predecessor ids [...], candidate ids [..., K] -> [..., K]."""
        context = self.predecessor_codebook[predecessor] * projected.to(self.predecessor_codebook.dtype)
        return torch.einsum("...r,...kr->...k", context, self.successor_codebook[candidates])
