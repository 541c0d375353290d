"""The seam between the decode loop and a drafter implementation (torch here; ONNX Runtime, engines elsewhere).

A proposer keeps per-request drafter context in an opaque state whose slots mirror the target cache's slots
(same order, same validity mask), so the loop can append, crop and mask both the same way.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from portable_spec.core.drafter import ContextKV, Drafter
from portable_spec.core.matmul_layout import LayoutTable, measured_linears
from portable_spec.core.spec import DrafterConfig


class DraftProposer(Protocol):
    """Built for one target, checked against it where it is built (TargetModel.bind for the torch drafter,
    OnnxDrafterGraph for an exported graph): the decode loop takes it as bound."""

    config: DrafterConfig

    def begin(self, features: torch.Tensor, positions: torch.Tensor) -> Any:
        """Context state for prompt slots: features [B, S, F] at positions [B, S]."""

    def extend(self, state: Any, features: torch.Tensor, positions: torch.Tensor) -> Any:
        """Append n slots (features [B, n, F]) to the state."""

    def crop(self, state: Any, length: int) -> Any:
        """Keep the first `length` slots."""

    def propose(
        self,
        state: Any,
        valid: torch.Tensor,
        anchor_tokens: torch.Tensor,
        anchor_positions: torch.Tensor,
        num_drafts: int,
    ) -> torch.Tensor:
        """Greedy draft tokens [B, num_drafts] after each anchor, seeing only slots where valid [B, S]."""

    def propose_scored(
        self,
        state: Any,
        valid: torch.Tensor,
        anchor_tokens: torch.Tensor,
        anchor_positions: torch.Tensor,
        num_drafts: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As propose, plus the drafter's probability of each draft [B, num_drafts] (confidence-cut rounds)."""

    def passes_per_round(self, num_drafts: int) -> int:
        """Drafter forward passes one round costs (for stats)."""

    # Optional: `decode_layout(table) -> context manager`, entered around each generate call (TorchProposer uses it
    # for the measured matmul layout, matmul_layout.py); a proposer without it runs as it is.
    # Optional: `samples_drafts` (True) and `propose_sampled(state, valid, anchor_tokens, anchor_positions,
    # num_drafts, sampler) -> (drafts, probability, q [B, n, V])`: a proposer that draws its drafts from a
    # distribution at T > 0 (sampling.DraftSampler) and hands verification that q; without it drafts are greedy
    # (q one-hot), lossless too.


@dataclass
class TorchContext:
    """The torch proposer's state: per-layer injected (k, v) and the positions of their slots (sliding windows
    are cut by position: slots hold holes where drafts were rejected)."""

    kv: ContextKV
    positions: torch.Tensor  # [B, S]


class TorchProposer:
    """The reference proposer: the torch drafter with its injected context KV cached per layer."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        self.config = drafter.config

    def begin(self, features, positions) -> TorchContext:
        return TorchContext(self.drafter.context_kv(features, positions), positions)

    def extend(self, state: TorchContext, features, positions) -> TorchContext:
        new = self.drafter.context_kv(features, positions)
        kv = [(torch.cat((k, nk), dim=2), torch.cat((v, nv), dim=2)) for (k, v), (nk, nv) in zip(state.kv, new)]
        return TorchContext(kv, torch.cat((state.positions, positions), dim=1))

    def crop(self, state: TorchContext, length: int) -> TorchContext:
        return TorchContext([(k[:, :, :length], v[:, :, :length]) for k, v in state.kv], state.positions[:, :length])

    def propose(self, state: TorchContext, valid, anchor_tokens, anchor_positions, num_drafts):
        return self.drafter.propose(state.kv, valid, anchor_tokens, anchor_positions, num_drafts, state.positions)

    def propose_scored(self, state: TorchContext, valid, anchor_tokens, anchor_positions, num_drafts):
        return self.drafter.propose_scored(
            state.kv, valid, anchor_tokens, anchor_positions, num_drafts, state.positions
        )

    def passes_per_round(self, num_drafts: int) -> int:
        return num_drafts if self.drafter.behaviour.autoregressive else 1

    @property
    def samples_drafts(self) -> bool:
        """A drafter that picks slot after slot (dflash2, dspark) samples its drafts at T > 0, as upstream does."""
        return self.drafter.behaviour.sequential_head

    def propose_sampled(self, state: TorchContext, valid, anchor_tokens, anchor_positions, num_drafts, sampler):
        return self.drafter.propose_drafts(
            state.kv, valid, anchor_tokens, anchor_positions, num_drafts, state.positions, sampler
        )

    def decode_layout(self, table: LayoutTable) -> AbstractContextManager:
        """The drafter's linear layers in `table`'s measured layouts while a generate call runs (matmul_layout.py)."""
        return measured_linears(table, self.drafter)
