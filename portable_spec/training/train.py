"""Drafter distillation: random anchors per sequence, block slot predicting token anchor+i, loss weight
exp(-(i-1)/gamma). The target is frozen; its features come from the layers the drafter config names.
Training state (drafter + optimizer + step) is saved atomically, as safetensors + JSON, and resumes exactly:
step s trains on global batch s (batches.py), whatever the number of ranks (distributed.py) sharing it.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from portable_spec.core.drafter import Drafter, load_drafter
from portable_spec.core.outputs import write_dir_atomically
from portable_spec.core.spec import DrafterConfig, SpecError, read_config
from portable_spec.core.target import TargetModel, drafter_config_for  # noqa: F401 - re-exported for callers
from portable_spec.training import distributed
from portable_spec.training.batches import step_generator
from portable_spec.training.data import sample_windows
from portable_spec.training.distributed import SINGLE, Ranks
from portable_spec.training.sharding import Layout, ShardedDrafter
from portable_spec.training.work_dir import changed_settings


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(400, ge=1, description="Optimizer steps.")
    batch_size: int = Field(
        8, ge=1, description="Sequences per optimizer step: the global batch, whatever the number of ranks."
    )
    grad_accum: int = Field(
        1, ge=1, description="Micro-batches per step on each rank (batch-size = rows x ranks x grad-accum)."
    )
    seq_len: int = Field(256, ge=8, description="Tokens per sequence.")
    anchors_per_seq: int = Field(16, ge=1, description="Blocks drafted per sequence per step.")
    lr: float = Field(2e-3, gt=0, description="Peak learning rate (linear warmup, cosine decay).")
    warmup_steps: int = Field(20, ge=0)
    loss_gamma: float = Field(7.0, gt=0, description="Slot i's loss weight is exp(-(i-1)/gamma).")
    seed: int = Field(0, ge=0)
    save_every: int = Field(100, ge=1, description="Steps between resumable training-state saves.")
    time_budget: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds of training (resumes included): the learning-rate "
        "schedule follows elapsed time and the run ends on time, checkpoint written; steps stays a cap.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA (fp32 master weights), fp32 elsewhere."
    )
    drafter_parallel: Layout = Field(
        "ddp", description="With several ranks: the drafter whole on each (ddp) or sharded over them (fsdp, FSDP2)."
    )
    init_from: str | None = Field(
        None,
        description="Warm start: a drafter checkpoint for the same target and shape (kind, layers, sizes, "
        "feature layers, draft vocabulary), trained further with a fresh optimizer and schedule.",
    )


def block_predictions(
    drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The drafter's teacher-forced blocks at many anchors in one pass: features [B, T, F] of tokens [B, T'] (T' >= T,
    every anchor + block_size <= T'), anchors [B, A] -> (draft-vocabulary logits [B, A, k-1, V_draft] for offsets
    1..k-1, the true block tokens [B, A, k]). Block j's context is every position before its anchor, as in
    decoding; what training and the held-out acceptance share."""
    config, batch = drafter.config, tokens.shape[0]
    k, num_anchors, context_len = config.block_size, anchors.shape[1], features.shape[1]
    positions = torch.arange(context_len, device=tokens.device).expand(batch, -1)
    block_positions = anchors[:, :, None] + torch.arange(k, device=tokens.device)  # [B, A, k]
    true_tokens = tokens.gather(1, block_positions.reshape(batch, -1)).view(batch, num_anchors, k)
    if drafter.behaviour.autoregressive:
        block_ids = true_tokens
    else:
        block_ids = torch.full_like(true_tokens, config.mask_token_id)
        block_ids[..., 0] = true_tokens[..., 0]
    context_mask = (positions[:, None, :] < anchors[:, :, None]).repeat_interleave(k, dim=1)  # [B, A*k, T]
    context = drafter.context_kv(features, positions)
    hidden = drafter.block_hidden(block_ids, block_positions, context, context_mask, positions)
    slots = [drafter.prediction_slot(offset) for offset in range(1, k)]
    return drafter.scored_logits(hidden[:, :, slots]), true_tokens


def drafter_loss(drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, gamma: float):
    """features [B, T, F] of tokens [B, T], anchors [B, A] (each <= T - block_size) -> weighted cross-entropy over
    draft offsets. With a reduced draft vocabulary, tokens outside it carry no loss (they can never be drafted)."""
    batch, num_anchors, k = tokens.shape[0], anchors.shape[1], drafter.config.block_size
    predicted, true_tokens = block_predictions(drafter, features, tokens, anchors)  # [B, A, k-1, V_draft]
    labels = true_tokens[..., 1:]
    if drafter.config.draft_vocab_size is not None:
        labels = target_to_draft(drafter, labels)
    losses = F.cross_entropy(predicted.flatten(0, 2), labels.flatten(), reduction="none", ignore_index=-100)
    weights = torch.exp(-torch.arange(k - 1, dtype=torch.float32, device=tokens.device) / gamma)
    return (losses.view(batch, num_anchors, k - 1) * weights).sum() / (weights.sum() * batch * num_anchors)


def target_to_draft(drafter: Drafter, target_ids: torch.Tensor) -> torch.Tensor:
    """Target ids -> draft-vocabulary indices, -100 (ignored by the loss) where outside the draft vocabulary."""
    lookup = torch.full((drafter.config.vocab_size,), -100, dtype=torch.int64, device=target_ids.device)
    draft_ids = drafter.draft_token_ids().to(target_ids.device)
    lookup[draft_ids] = torch.arange(len(draft_ids), device=target_ids.device)
    return lookup[target_ids]


def stream_batches(target: TargetModel, stream: torch.Tensor, config: "TrainConfig", layer_ids: list[int], k: int):
    """draw(step, rows) for training on a raw token stream: global batch `step` is random windows and anchors from
    the step's generator; the frozen target computes the features of the rows asked."""

    def draw(step: int, rows: slice = slice(None)):
        generator = step_generator(config.seed, step)
        tokens = sample_windows(stream, config.seq_len, config.batch_size, generator)[rows].to(target.device)
        scores = torch.rand(config.batch_size, config.seq_len - k, generator=generator)[rows]
        anchors = (1 + scores.argsort(dim=1)[:, : config.anchors_per_seq]).to(target.device)  # distinct, [1, T - k]
        positions = torch.arange(config.seq_len, device=target.device).expand(len(tokens), -1)
        features = target.features(tokens, positions, torch.ones_like(tokens, dtype=torch.bool), layer_ids)
        return tokens, features, anchors

    return draw


def _lr_at(step: int, config: TrainConfig, elapsed: float) -> float:
    """Linear warmup over warmup_steps, then cosine decay over the steps or, with a time budget, over its seconds
    (whichever ends first), so a run sized by time still anneals."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(config.steps - config.warmup_steps, 1)
    if config.time_budget is not None:
        progress = max(progress, elapsed / config.time_budget)
    return config.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The forward pass's precision: bf16 autocast (fp32 weights and optimizer) where asked or on CUDA by default."""
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def check_shapes(block_size: int, config: TrainConfig) -> None:
    """Anchors need a whole block after them inside a sequence: seq_len - block_size >= anchors_per_seq."""
    room = config.seq_len - block_size
    if room < config.anchors_per_seq:
        raise SpecError(
            f"seq_len={config.seq_len} leaves {max(room, 0)} anchor positions for block_size="
            f"{block_size}, anchors_per_seq={config.anchors_per_seq} needs that many; use "
            f"--seq-len >= {block_size + config.anchors_per_seq}"
        )


# a resumed run may train longer (in steps or seconds), save more often, or split and lay out the same global batch
# and drafter otherwise
RESUMABLE_CHANGES = ("steps", "save_every", "time_budget", "grad_accum", "drafter_parallel")


def _save_state(state_dir: Path, drafter: Drafter, state: dict, step: int, config: TrainConfig, elapsed: float) -> None:
    """The whole drafter and its optimizer state (one-process layout, sharding.ShardedDrafter.optimizer_state)."""
    tensors = {f"state.{i}.{name}": value for i, entry in state["state"].items() for name, value in entry.items()}

    def write(tmp: Path) -> None:
        drafter.save(tmp / "drafter")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "optimizer.safetensors"))
        (tmp / "trainer_state.json").write_text(
            json.dumps(
                {
                    "step": step,
                    "elapsed_seconds": elapsed,
                    "param_groups": state["param_groups"],
                    "train_config": config.model_dump(),
                }
            )
        )

    write_dir_atomically(state_dir, write, kind="training-state")


def _load_state(
    state_dir: Path, target: TargetModel, drafter_config: DrafterConfig, config: TrainConfig
) -> tuple[Drafter, dict, int, float]:
    """Resume only the run that was asked for: the saved drafter and training configs must match (RESUMABLE_CHANGES
    may change), else a field-by-field diff; a corrupt state file is refused by name. Returns the drafter, the
    optimizer state (one-process layout), the step and the seconds trained."""
    meta_file = state_dir / "trainer_state.json"
    try:
        meta = json.loads(meta_file.read_text())
        step, groups = int(meta["step"]), meta["param_groups"]
        elapsed = float(meta.get("elapsed_seconds", 0.0))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as error:
        raise SpecError(
            f"{meta_file}: corrupt training state ({type(error).__name__}: {error}); delete {state_dir} "
            "to start over, or restore it"
        ) from None
    saved_drafter = read_config(state_dir / "drafter")
    diff = changed_settings(saved_drafter.model_dump(), drafter_config.model_dump())
    diff += changed_settings(meta.get("train_config", {}), config.model_dump(), ignore=RESUMABLE_CHANGES)
    if diff:
        raise SpecError(
            f"{state_dir}: holds another training run than the one asked for ({'; '.join(diff)}); "
            f"use another --work-dir, delete {state_dir} to start over, or ask for the saved settings"
        )
    drafter = target.bind(load_drafter(state_dir / "drafter")).to(target.device)
    state: dict = {}
    for key, value in load_file(str(state_dir / "optimizer.safetensors")).items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    return drafter, {"state": state, "param_groups": groups}, step, elapsed


def train_drafter(
    target: TargetModel,
    drafter_config: DrafterConfig,
    stream: torch.Tensor,
    config: TrainConfig,
    out_dir: Path,
    state_dir: Path | None = None,
    progress: bool = True,
    heldout=None,
) -> Drafter:
    """Train on a raw token stream (the fixtures' recipe): the target runs on every batch; `heldout` as in
    train_loop."""
    vocab = target.vocab_size
    if stream.ndim != 1 or stream.dtype.is_floating_point or stream.dtype == torch.bool:
        raise SpecError(
            f"stream: a 1-D tensor of integer token ids is needed, got {stream.dtype} of shape {tuple(stream.shape)}"
        )
    if len(stream) < config.seq_len:
        raise SpecError(
            f"stream has {len(stream)} tokens, fewer than seq_len={config.seq_len}; give more text or lower --seq-len"
        )
    if int(stream.min()) < 0 or int(stream.max()) >= vocab:
        raise SpecError(
            f"stream holds token ids outside [0, {vocab}) (min {int(stream.min())}, max "
            f"{int(stream.max())}); tokenize with the target's tokenizer"
        )
    draw = stream_batches(target, stream, config, drafter_config.target_layer_ids, drafter_config.block_size)
    return train_loop(target, drafter_config, draw, config, out_dir, state_dir, progress, heldout=heldout)


def initial_drafter(
    target: TargetModel, drafter_config: DrafterConfig, seed: int, draft_vocab: torch.Tensor | None = None
) -> Drafter:
    """A fresh drafter on the target's device, initialised on the CPU from `seed` (the same weights on every
    device), with its draft vocabulary set."""
    torch.manual_seed(seed)
    drafter = target.bind(Drafter(drafter_config))
    if draft_vocab is not None:
        drafter.set_draft_vocab(draft_vocab)
    return drafter.to(target.device)


def warm_start(target: TargetModel, drafter_config: DrafterConfig, init_from: Path) -> Drafter:
    """The drafter at `init_from` (its weights and draft vocabulary) on the target's device, after checking it is
    the drafter this run would train: bound to this target, the same config field for field."""
    drafter = target.bind(load_drafter(init_from))  # fp32 master weights, whatever the target's dtype
    diff = changed_settings(drafter.config.model_dump(), drafter_config.model_dump())
    if diff:
        raise SpecError(
            f"--init-from {init_from}: another drafter shape than this run trains ({'; '.join(diff)}); pass the "
            "saved settings (e.g. --intermediate-size, --target-layer-ids, --draft-vocab-size) or drop --init-from"
        )
    return drafter.to(target.device)


class DrafterLoss(torch.nn.Module):
    """The drafter's training loss as a module's forward, which DistributedDataParallel needs to sync gradients."""

    def __init__(self, drafter: Drafter, gamma: float) -> None:
        super().__init__()
        self.drafter, self.gamma = drafter, gamma

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        return drafter_loss(self.drafter, features, tokens, anchors, self.gamma)


def train_loop(
    target: TargetModel,
    drafter_config: DrafterConfig,
    draw,
    config: TrainConfig,
    out_dir: Path,
    state_dir: Path | None = None,
    progress: bool = True,
    draft_vocab: torch.Tensor | None = None,
    log: Callable[[int, float, float], None] | None = None,
    out_owner: str | None = None,
    force: bool = False,
    heldout=None,
    ranks: Ranks = SINGLE,
) -> Drafter:
    """Optimise a drafter on batches `draw(step, rows) -> (tokens, features, anchors)` (rows of global batch
    `step`, on the target's device), so resuming from state_dir (saved every save_every steps) repeats the
    uninterrupted run. With several `ranks` (torch.distributed started), each trains on its rows of every global
    batch in DDP, and only rank 0 logs, evaluates and writes. The checkpoint records `out_owner` (the work
    directory) and replaces only a checkpoint of the same owner unless `force` (outputs.check_output_dir). With
    `heldout` (heldout.HeldoutTracker, rank 0's), held-out acceptance is measured at the start, every
    `heldout.every` seconds and at the end, and the checkpoint written is the best drafter it saw. `log(step, loss,
    seconds)` gets each step's mean loss and the training seconds at its end (a resume's included)."""
    check_shapes(drafter_config.block_size, config)
    distributed.check_batch(ranks, config.batch_size, config.grad_accum)
    for param in target.model.parameters():
        param.requires_grad_(False)
    device = target.device
    optimizer_state = None
    if state_dir is not None and (Path(state_dir) / "trainer_state.json").exists():
        drafter, optimizer_state, start, elapsed = _load_state(Path(state_dir), target, drafter_config, config)
    else:
        if config.init_from is not None:
            drafter = warm_start(target, drafter_config, Path(config.init_from))
        else:
            drafter = initial_drafter(target, drafter_config, config.seed, draft_vocab)
        start, elapsed = 0, 0.0
    drafter.train()
    trainee = ShardedDrafter(drafter, DrafterLoss(drafter, config.loss_gamma), ranks, device, config.drafter_parallel)
    optimizer = torch.optim.AdamW(trainee.params, lr=config.lr, weight_decay=0.0)
    if optimizer_state is not None:
        trainee.load_optimizer_state(optimizer, optimizer_state)
    heldout = heldout if ranks.main else None
    evaluating = distributed.from_main(ranks, heldout is not None)  # every rank takes part under fsdp
    if heldout is not None and start:
        heldout.last_seconds = elapsed
    elif heldout is not None:
        heldout.reset()
    if evaluating and start == 0:
        _evaluate(trainee, heldout, 0, 0.0)  # where training starts from (a warm start's own tau)

    def save(step: int, seconds: float) -> None:
        whole, state = trainee.whole_drafter(), trainee.optimizer_state(optimizer)  # collectives under fsdp
        if ranks.main:
            _save_state(Path(state_dir), whole, state, step, config, seconds)

    bar = tqdm(
        range(start, config.steps),
        initial=start,
        total=config.steps,
        disable=not (progress and ranks.main),
        desc=drafter_config.kind,
    )
    clock = time.perf_counter() - elapsed  # elapsed seconds carry over a resume
    done, saved, stop = start, start, False  # saved: the step of the training state on disk
    try:
        with distributed.peers_watched(ranks):
            for step in bar:
                seconds = time.perf_counter() - clock
                due = heldout is not None and heldout.last_step != done and heldout.due(seconds)
                elapsed, due = distributed.agree(ranks, device, seconds, due)
                if due:  # rank 0 decides a plateau stop for every rank
                    stop = distributed.from_main(ranks, _evaluate(trainee, heldout, done, elapsed))
                if stop or (config.time_budget is not None and elapsed >= config.time_budget):
                    break
                for group in optimizer.param_groups:
                    group["lr"] = _lr_at(step, config, elapsed)
                loss = _step(trainee, draw, step, config, ranks, device)
                torch.nn.utils.clip_grad_norm_(trainee.params, 1.0)
                optimizer.step()
                loss_value = distributed.mean(ranks, loss)
                bar.set_postfix(loss=f"{loss_value:.3f}")
                if log is not None and ranks.main:
                    log(step + 1, loss_value, time.perf_counter() - clock)
                done = step + 1
                if state_dir is not None and done % config.save_every == 0:
                    save(done, time.perf_counter() - clock)
                    saved = done
            if state_dir is not None and done > saved:  # where a longer run resumes
                save(done, time.perf_counter() - clock)
            if evaluating and distributed.from_main(ranks, heldout is not None and heldout.last_step != done):
                _evaluate(trainee, heldout, done, time.perf_counter() - clock)
            whole = trainee.whole_drafter()
    except distributed.RankStopped as error:
        if state_dir is None or not saved:
            raise distributed.RankStopped(f"{error}; no training state was saved yet") from None
        raise distributed.RankStopped(
            f"{error}; the training state of step {saved} in {state_dir} is intact: rerun to resume it, at any "
            "world size"
        ) from None
    finally:
        bar.close()
    if ranks.main:
        whole.eval()
        if heldout is not None:
            heldout.load_best(whole)
        whole.save(out_dir, force=force, owner=out_owner)
    distributed.barrier(ranks)  # every rank returns once the checkpoint is written
    drafter.eval()
    return whole if ranks.main else drafter


def _evaluate(trainee: ShardedDrafter, heldout, step: int, seconds: float) -> bool:
    """Held-out acceptance of the drafter now, on rank 0 (every rank calls this: the weights are gathered under
    fsdp). True when rank 0's tracker asks to stop (a plateau)."""
    whole = trainee.whole_drafter()
    return heldout is not None and heldout.record(whole, step, seconds)


def _step(trainee: ShardedDrafter, draw, step: int, config: TrainConfig, ranks: Ranks, device) -> torch.Tensor:
    """One optimizer step's gradients: this rank's grad_accum micro-batches of global batch `step`, each loss
    scaled so the gradient (averaged over ranks by DDP or FSDP) is the global batch's mean loss gradient. Returns
    this rank's mean micro-batch loss."""
    trainee.model.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for micro in range(config.grad_accum):
        tokens, features, anchors = draw(step, ranks.micro_rows(config.batch_size, config.grad_accum, micro))
        last = micro == config.grad_accum - 1
        with contextlib.nullcontext() if last else trainee.no_sync():
            with autocast_for(config.precision, device):
                loss = trainee.model(features, tokens, anchors) / config.grad_accum
            loss.backward()
        total += loss.detach().float()
    return total
