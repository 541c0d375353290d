"""Where the drafter's and the target's weights live across ranks.

The drafter: whole on every rank in DistributedDataParallel (`ddp`, the default; gradients averaged in backward),
or sharded with FSDP2 (`fsdp`: `fully_shard`, weights, gradients and AdamW state split over the ranks and gathered
for each forward), for a drafter whose optimizer state does not fit one device beside the target. The frozen
target: replicated, or each decoder layer sharded with FSDP2 (`fsdp`) when it does not fit one device; its
embedding and LM head stay whole, since the drafter reads them outside the target's forward.

Whatever the layout, the training state on disk is the one-process layout (full weights, AdamW state by parameter
index): rank 0 writes it, every rank reads it, so a run resumes at any world size and in either layout.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training.distributed import Ranks

Layout = Literal["ddp", "fsdp"]
TargetLayout = Literal["replicate", "fsdp"]


class ShardedDrafter:
    """The drafter under training in its layout: `model(features, tokens, anchors)` is the loss; the whole weights
    and optimizer state can be gathered to rank 0 (a collective under fsdp: every rank calls it)."""

    def __init__(self, drafter: Drafter, loss_module: torch.nn.Module, ranks: Ranks, device: torch.device, layout):
        self.drafter, self.ranks, self.layout = drafter, ranks, layout
        self.names = [name for name, p in drafter.named_parameters() if p.requires_grad]  # optimizer order
        if layout == "fsdp" and ranks.distributed:
            from torch.distributed.fsdp import fully_shard

            self.whole = _copy_of(drafter) if ranks.main else None  # rank 0's plain copy to evaluate and save
            fully_shard(loss_module)
            self.model = loss_module
        else:
            from portable_spec.training.distributed import data_parallel

            self.whole = drafter
            self.model = data_parallel(loss_module, ranks, device)
        params = dict(drafter.named_parameters())  # after fully_shard: the sharded parameters
        self.params = [params[name] for name in self.names]  # what the optimizer steps and clipping reads

    @property
    def sharded(self) -> bool:
        return self.layout == "fsdp" and self.ranks.distributed

    def no_sync(self):
        """DDP's: skip the gradient all-reduce of a micro-batch that is not the step's last."""
        if self.ranks.distributed and not self.sharded:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def whole_drafter(self) -> Drafter | None:
        """Rank 0's drafter with every weight whole (gathered under fsdp: a collective); None on other ranks."""
        if not self.sharded:
            return self.whole if self.ranks.main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.ranks.main:
            return None
        prefix = "drafter."
        weights = {name[len(prefix) :]: value for name, value in full.items() if name.startswith(prefix)}
        device = self.whole.fc.weight.device
        self.whole.load_state_dict({name: value.to(device) for name, value in weights.items()})
        return self.whole

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """Rank 0's optimizer state in the one-process layout ({"state": {index: {...}}, "param_groups"}); a
        collective under fsdp."""
        if not self.sharded:
            return optimizer.state_dict() if self.ranks.main else None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        full = get_optimizer_state_dict(
            self.model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if not self.ranks.main:
            return None
        index = {f"drafter.{name}": i for i, name in enumerate(self.names)}
        groups = [{**group, "params": [index[name] for name in group["params"]]} for group in full["param_groups"]]
        return {"state": {index[name]: value for name, value in full["state"].items()}, "param_groups": groups}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load the one-process layout's optimizer state (read from disk on every rank) into this layout."""
        if not self.sharded:
            optimizer.load_state_dict(state)  # moves the state to the drafter's device
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = [f"drafter.{name}" for name in self.names]
        full = {
            "state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(self.model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def _copy_of(drafter: Drafter) -> Drafter:
    """A plain drafter with the same config, weights and binding (the shared target modules are not copied)."""
    copy = Drafter(drafter.config)
    copy.load_state_dict(drafter.state_dict())
    copy.shared = drafter.shared
    return copy.to(drafter.fc.weight.device)


def shard_target(target: TargetModel, ranks: Ranks, layout: TargetLayout) -> None:
    """Shard each decoder layer of the frozen target over the ranks (fsdp), or leave it whole (replicate)."""
    if layout != "fsdp" or not ranks.distributed:
        return
    from torch.distributed.fsdp import fully_shard

    layers = getattr(target.model.base_model, "layers", None)
    if layers is None:
        raise SpecError(
            f"--target-parallel fsdp: {type(target.model).__name__} keeps no decoder layers at base_model.layers; "
            "use --target-parallel replicate"
        )
    for layer in layers:
        fully_shard(layer)


def check_layouts(ranks: Ranks, target_layout: TargetLayout, features: str) -> None:
    """A sharded target runs only in lockstep on every rank, so it computes features in the step (online)."""
    if target_layout == "fsdp" and ranks.distributed and features != "online":
        raise SpecError(
            f"--target-parallel fsdp with --features {features}: a target sharded over the ranks computes features "
            "in the training step; pass --features online"
        )
