"""Training batches that are the same whatever the number of ranks.

Step s trains on the global batch s: the next batch_size sequences of a seeded permutation per pass over the data
(each usable sequence once per pass), with anchors drawn for the whole batch from a generator seeded by
(seed, step). Every rank draws that plan, and gathers (and, with online features, runs the target on) only its
own rows; so a run is the same at any world size and resumes exactly, at another world size too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from portable_spec.core.target import TargetModel
from portable_spec.training.features import FeatureDataset


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of step `step`'s random draws (anchors, windows)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def pass_order(count: int, seed: int, pass_index: int) -> torch.Tensor:
    """The order of the `count` sequences in pass `pass_index` over the data."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed * 7_919 + pass_index + 1))


@dataclass
class ReplyBatches:
    """draw(step, rows) -> (tokens, features, anchors) of rows `rows` of global batch `step`, over the reply
    sequences `usable` of `dataset` (features cached in it, or online from `target` at `layer_ids`)."""

    dataset: FeatureDataset
    usable: list[int]
    batch_size: int
    label_span: int  # tokens after each anchor its labels read (DrafterConfig.label_span)
    anchors_per_seq: int
    seq_len: int
    seed: int
    target: TargetModel | None = None
    layer_ids: list[int] | None = None
    _orders: dict[int, list[int]] = field(default_factory=dict, repr=False)

    def picks(self, step: int) -> list[int]:
        """Global batch `step`: positions step * batch_size ... of the passes laid end to end."""
        count, first = len(self.usable), step * self.batch_size
        return [self.usable[self._order(p // count)[p % count]] for p in range(first, first + self.batch_size)]

    def _order(self, pass_index: int) -> list[int]:
        if pass_index not in self._orders:
            if len(self._orders) >= 2:  # the passes of the current batch are all that is needed
                self._orders.clear()
            self._orders[pass_index] = pass_order(len(self.usable), self.seed, pass_index).tolist()
        return self._orders[pass_index]

    def passes(self, steps: int) -> float:
        """Passes over the data that `steps` steps make."""
        return steps * self.batch_size / len(self.usable)

    def __call__(self, step: int, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        picks = self.picks(step)
        anchors = self.dataset.anchors(
            picks, self.label_span, self.anchors_per_seq, self.seq_len, step_generator(self.seed, step)
        )
        return self.dataset.gather(picks[rows], anchors[rows], self.seq_len, self.target, self.layer_ids)
