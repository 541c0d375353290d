"""DFlash2's candidate selector: how a dflash2 drafter turns its block logits into drafts.

As z-lab `dflash` 0.1.0 (dflash/model.py `CandidateSelector.select`) and vllm-project/speculators 0.9.0
(models/dflash2/model_definitions.py `CandidateSelector`) compute it: each draft slot's top-k logits are its
candidates (their logits the unary scores); slot after slot, a candidate c scores

    unary(c) + < predecessor_codebook[prev] * hidden_projection(h_slot), successor_codebook[c] >

where `prev` is the token picked in the slot before (the anchor for the first slot), and the best-scoring candidate
is the slot's draft. The codebooks are indexed by target token ids, so the drafter scores the full vocabulary.
The parameter names are the ones both projects save (`candidate_selector.predecessor_codebook`, ...).
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

    def select(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, sampler=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """hidden [B, n, H] and logits [B, n, V] of the n draft slots, anchor ids [B] -> (drafts [B, n], the selector's
        probability of each [B, n], the q [B, n, V] they were drawn from or None): greedy (the probability a softmax
        over the candidates' scores), or drawn by `sampler` (sampling.DraftSampler) from the candidates' scores at the
        request's temperature (z-lab `dflash` 0.1.0 `select` samples softmax(scores / T); the request's top-k and
        top-p apply here too), the q being zero outside the candidates."""
        unary, candidates = self.candidates(logits)
        projected = self.hidden_projection(hidden)
        predecessor, drafts, probabilities, qs = anchor, [], [], []
        for slot in range(hidden.shape[1]):
            scores = (
                unary[:, slot].float()
                + self.transition_scores(projected[:, slot], predecessor, candidates[:, slot]).float()
            )
            if sampler is None:
                index = scores.argmax(dim=-1)
                predecessor = candidates[:, slot].gather(-1, index[:, None])[:, 0]
                probabilities.append(scores.softmax(dim=-1).gather(-1, index[:, None])[:, 0])
            else:  # the candidates' scores at their token ids, -inf elsewhere: q over the candidates only
                full = scores.new_full((scores.shape[0], logits.shape[-1]), float("-inf"))
                predecessor, q = sampler(slot, full.scatter(-1, candidates[:, slot], scores))
                probabilities.append(q.gather(-1, predecessor[:, None])[:, 0])
                qs.append(q)
            drafts.append(predecessor)
        q = torch.stack(qs, dim=1) if sampler is not None else None
        return torch.stack(drafts, dim=1), torch.stack(probabilities, dim=1), q
