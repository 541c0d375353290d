"""Training on several processes with torch.distributed, as torchrun starts them.

torchrun (one node or many, through its rendezvous) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
a process without them is world 1 and never touches torch.distributed. The drafter trains in DDP (NCCL on CUDA,
gloo on CPUs); every rank computes the same global batch plan and takes its own rows of it (batches.py), so one
seed gives the same run at any world size, and a run resumes at another one. Rank 0 is the only writer of the
checkpoint, the training state and the curves; the work directory must be one filesystem every rank sees.

Where the weights live across ranks. Where the drafter's and the target's weights live across ranks.

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
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training.config import TargetLayout

T = TypeVar("T")

# a rank waits this long at a collective for the others (reply generation on one rank may run long before the
# next barrier); a rank that dies ends the others at once under torchrun, which stops the run
COLLECTIVE_TIMEOUT = timedelta(hours=2)
# a process given RANK/WORLD_SIZE by hand (no torchrun) waits this long for its peers to join, then says so, instead
# of sitting in the store's rendezvous for the 2 h above; PORTABLE_SPEC_JOIN_SECONDS sets another
JOIN_SECONDS = 300
# after torchrun's SIGTERM, the seconds a rank blocked inside a collective (where Python cannot run its signal
# handler) is given before it says so and exits; torchrun itself waits 30 s, then kills it without a word
STOP_GRACE_SECONDS = 3.0
_met = False  # this process joined a process group (error lines then name the rank)


class RankStopped(Exception):
    """This rank stopped because another one failed (torchrun ended it, or a collective lost its peers); the error
    line names this rank (error_prefix)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: rank of world; local_rank picks its GPU on a node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def share(self, items: Sequence[T]) -> list[T]:
        """This rank's share of a work list (item i goes to rank i mod world): each item done once across ranks."""
        return list(items[self.rank :: self.world])

    def micro_rows(self, batch_size: int, grad_accum: int, micro_step: int) -> slice:
        """The rows of a global batch this rank trains on in one micro-step (batch = rows x world x grad_accum)."""
        rows = batch_size // (self.world * grad_accum)
        start = (micro_step * self.world + self.rank) * rows
        return slice(start, start + rows)

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world}"


SINGLE = Ranks()


def from_environment(environ=os.environ) -> Ranks:
    """The ranks torchrun set in the environment; world 1 when it did not (a plain process)."""
    if "WORLD_SIZE" not in environ:
        return SINGLE
    try:
        ranks = Ranks(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", 0)))
    except (KeyError, ValueError) as error:
        raise SpecError(
            f"WORLD_SIZE is set but RANK / LOCAL_RANK are not integers ({error}); start several processes with "
            "torchrun, or unset WORLD_SIZE for one"
        ) from None
    if not 0 <= ranks.rank < ranks.world:
        raise SpecError(f"RANK={ranks.rank} is outside WORLD_SIZE={ranks.world}; start the processes with torchrun")
    return ranks


def check_batch(ranks: Ranks, batch_size: int, grad_accum: int) -> None:
    """The global batch splits evenly into world x grad_accum micro-batches (so it is the same at any world size)."""
    parts = ranks.world * grad_accum
    if batch_size % parts:
        raise SpecError(
            f"--batch-size {batch_size} (the global batch) does not split into {ranks.world} ranks x "
            f"--grad-accum {grad_accum} = {parts} equal micro-batches; use a multiple of {parts}"
        )


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """Each rank's device: with several ranks, `cuda` means this node's GPU number local_rank."""
    if not ranks.distributed or device.type != "cuda":
        return device
    if device.index is not None:
        raise SpecError(
            f"--device {device}: with {ranks.world} ranks each one takes GPU LOCAL_RANK; pass --device cuda "
            "(and pick GPUs with CUDA_VISIBLE_DEVICES)"
        )
    return torch.device("cuda", ranks.local_rank)


def start(ranks: Ranks, device: torch.device) -> None:
    """Join the process group (NCCL on CUDA, gloo otherwise). torchrun ends the surviving ranks with SIGTERM when
    one fails: that becomes RankStopped, so the run ends with one line and nothing half-written."""
    global _met
    if not ranks.distributed or dist.is_initialized():
        return
    _met = True
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = {"device_id": device} if device.type == "cuda" else {}
    if device.type == "cuda":
        torch.cuda.set_device(device)  # FSDP2 puts its shards on the current device
    store = None if "TORCHELASTIC_RUN_ID" in os.environ else _joined_store(ranks)  # torchrun rendezvouses itself
    dist.init_process_group(
        backend, store=store, rank=ranks.rank, world_size=ranks.world, timeout=COLLECTIVE_TIMEOUT, **options
    )

    def stopped(signum, frame):
        raise RankStopped(f"stopped by torchrun (signal {signum}) because another rank failed")

    signal.signal(signal.SIGTERM, stopped)
    watch_stop_signal(ranks.rank)


def watch_stop_signal(rank: int, grace: float = STOP_GRACE_SECONDS) -> None:
    """Make SIGTERM end this rank with one line even while it waits inside a collective for a peer that died: the
    Python handler (RankStopped) runs only between bytecodes, never inside gloo's or NCCL's C++ wait. The signal
    also reaches a watcher thread through the wakeup fd; if the rank has not ended `grace` seconds later, the
    thread prints the line and exits the process (nothing is being written: the rank is blocked in a collective)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch() -> None:
        while signal.SIGTERM not in os.read(read_fd, 64):
            pass
        time.sleep(grace)
        print(
            f"error: rank {rank}: stopped by torchrun because another rank failed (it was waiting for that rank "
            "in a collective); its own line says what failed",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    threading.Thread(target=watch, name="portable-spec-stop", daemon=True).start()


def _joined_store(ranks: Ranks):
    """The rendezvous store of a process that RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT were set for by hand: every rank
    joined within JOIN_SECONDS, or one line saying who is missing and how to start them."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT")
    seconds = float(os.environ.get("PORTABLE_SPEC_JOIN_SECONDS", JOIN_SECONDS))
    if port is None or not port.isdigit():
        raise SpecError(
            f"WORLD_SIZE={ranks.world} without torchrun needs MASTER_PORT (got {port!r}); start the ranks with "
            "`torchrun --nproc-per-node N -m portable_spec.cli train ...`, or unset WORLD_SIZE for one process"
        )
    print(f"rank {ranks.rank}: waiting up to {seconds:g} s for {ranks.world} ranks at {host}:{port}", flush=True)
    try:
        return dist.TCPStore(
            host, int(port), ranks.world, is_master=ranks.rank == 0, timeout=timedelta(seconds=seconds),
            wait_for_workers=True,
        )  # fmt: skip
    except (RuntimeError, dist.DistStoreError) as error:
        raise SpecError(
            f"WORLD_SIZE={ranks.world}, RANK={ranks.rank}: the other ranks did not join at {host}:{port} within "
            f"{seconds:g} s ({str(error).splitlines()[0][:120]}); start every rank (torchrun --nproc-per-node "
            f"{ranks.world} does), or unset WORLD_SIZE to train in one process"
        ) from None


def finish() -> None:
    """Leave the process group `start` joined; a group another library made (vLLM's in-process engine, for
    replies) is that library's to destroy."""
    if _met and dist.is_initialized():
        dist.destroy_process_group()


# what gloo and NCCL say when a peer process is gone (they raise plain RuntimeErrors from DDP's backward)
PEER_LOST = re.compile(
    r"Connection (?:reset|closed|refused)(?: by peer)?|Broken pipe|NCCL communicator was aborted|Timed out"
)


@contextmanager
def peers_watched(ranks: Ranks) -> Iterator[None]:
    """A collective inside (a barrier, DDP's all-reduce in backward) failing because a peer is gone ends this rank
    with one RankStopped naming it; any other error passes unchanged."""
    try:
        yield
    except RuntimeError as error:  # dist.DistError is one
        found = PEER_LOST.search(str(error))
        if not ranks.distributed or (found is None and not isinstance(error, dist.DistError)):
            raise
        reason = found.group(0) if found else str(error).splitlines()[0]
        raise RankStopped(f"another rank left the run ({reason}; torchrun's report names it)") from None


def _collective(ranks: Ranks, run):
    with peers_watched(ranks):
        return run()


class MainFailed(Exception):
    """Rank 0 refused the run (its own error line says why); the other ranks end without one."""


def checked_by_main(ranks: Ranks, check) -> None:
    """Run `check()` on rank 0 only (checks of what the run writes: the other ranks would see rank 0's locks);
    its refusal ends every rank, rank 0 with the error, the others with MainFailed."""
    if not ranks.distributed:
        check()
        return
    failure = None
    if ranks.main:
        try:
            check()
        except Exception as error:  # noqa: BLE001 - re-raised on rank 0 once the others know
            failure = error
    if from_main(ranks, None if failure is None else str(failure)) is not None:
        if failure is not None:
            raise failure
        raise MainFailed()


def error_prefix() -> str | None:
    """How this process prefixes its error line: "" in one process (and on rank 0 before the ranks have met:
    argument checks fail alike everywhere), "rank R of W: " once they have, None to stay silent (MainFailed, or
    a rank other than 0 before the ranks have met)."""
    try:
        ranks = from_environment()
    except SpecError:
        return ""
    if not ranks.distributed:
        return ""
    if not _met:
        return "" if ranks.main else None
    return f"{ranks.describe()}: "


def barrier(ranks: Ranks) -> None:
    if ranks.distributed:
        _collective(ranks, dist.barrier)


def from_main(ranks: Ranks, value: T) -> T:
    """Rank 0's `value` on every rank (any picklable object; what rank 0 decided or found)."""
    if not ranks.distributed:
        return value
    box = [value]
    _collective(ranks, lambda: dist.broadcast_object_list(box, src=0))
    return box[0]


def agree(ranks: Ranks, device: torch.device, seconds: float, *flags: bool) -> tuple:
    """(the longest elapsed time, then each flag true on any rank): every rank then takes the same learning rate
    and the same decisions at the same step."""
    if not ranks.distributed:
        return (seconds, *flags)
    values = torch.tensor([seconds, *map(float, flags)], dtype=torch.float64, device=device)
    _collective(ranks, lambda: dist.all_reduce(values, op=dist.ReduceOp.MAX))
    return (float(values[0]), *(bool(v) for v in values[1:]))


def mean(ranks: Ranks, value: torch.Tensor) -> float:
    """The mean of a scalar over ranks (the step's loss over the global batch)."""
    if not ranks.distributed:
        return float(value)
    value = value.detach().to(torch.float64).reshape(1).clone()
    _collective(ranks, lambda: dist.all_reduce(value, op=dist.ReduceOp.SUM))
    return float(value) / ranks.world


def data_parallel(module: torch.nn.Module, ranks: Ranks, device: torch.device) -> torch.nn.Module:
    """`module` in DistributedDataParallel (gradients averaged over ranks in backward), or itself for one rank."""
    if not ranks.distributed:
        return module
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


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
            from portable_spec.training.parallel import data_parallel

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
            f"--target-parallel fsdp with --feature-mode {features}: a target sharded over the ranks computes features "
            "in the training step; pass --feature-mode online"
        )
