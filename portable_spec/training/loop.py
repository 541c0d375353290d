"""The training loop: AdamW on batches `draw(step, rows)`, linear warmup and cosine decay (by steps or by a time
budget), checkpoints of the training state every save_every steps, held-out acceptance while training, and
several ranks in DDP or FSDP2 (parallel.py). Step s trains on global batch s (batches.py) whatever the number of
ranks sharing it, so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training import parallel
from portable_spec.training.config import TrainConfig
from portable_spec.training.loss import DrafterLoss
from portable_spec.training.parallel import SINGLE, Ranks, ShardedDrafter
from portable_spec.training.state import hold_depthwise, initial_drafter, load_state, save_state, warm_start


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


def check_shapes(block_size: int, label_span: int, config: TrainConfig) -> None:
    """Anchors need a whole block's labels after them inside a sequence (DrafterConfig.label_span tokens):
    seq_len - label_span >= anchors_per_seq."""
    room = config.seq_len - label_span
    if room < config.anchors_per_seq:
        raise SpecError(
            f"seq_len={config.seq_len} leaves {max(room, 0)} anchor positions for block_size="
            f"{block_size}, anchors_per_seq={config.anchors_per_seq} needs that many; use "
            f"--seq-len >= {label_span + config.anchors_per_seq}"
        )


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
    check_shapes(drafter_config.block_size, drafter_config.label_span, config)
    parallel.check_batch(ranks, config.batch_size, config.grad_accum)
    for param in target.model.parameters():
        param.requires_grad_(False)
    device = target.device
    optimizer_state = None
    if state_dir is not None and (Path(state_dir) / "trainer_state.json").exists():
        drafter, optimizer_state, start, elapsed = load_state(Path(state_dir), target, drafter_config, config)
    else:
        if config.init_from is not None:
            drafter = warm_start(target, drafter_config, Path(config.init_from))
        else:
            drafter = initial_drafter(target, drafter_config, config.seed, draft_vocab)
        start, elapsed = 0, 0.0
    if config.depthwise_shift_mix:
        hold_depthwise(drafter)
    drafter.train()
    loss = DrafterLoss(drafter, config.loss_gamma, selector=not config.depthwise_shift_mix)
    trainee = ShardedDrafter(drafter, loss, ranks, device, config.drafter_parallel)
    optimizer = torch.optim.AdamW(trainee.params, lr=config.lr, weight_decay=0.0)
    if optimizer_state is not None:
        trainee.load_optimizer_state(optimizer, optimizer_state)
    heldout = heldout if ranks.main else None
    evaluating = parallel.from_main(ranks, heldout is not None)  # every rank takes part under fsdp
    if heldout is not None and start:
        heldout.last_seconds = elapsed
    elif heldout is not None:
        heldout.reset()
    if evaluating and start == 0:
        _evaluate(trainee, heldout, 0, 0.0)  # where training starts from (a warm start's own tau)

    def save(step: int, seconds: float) -> None:
        whole, state = trainee.whole_drafter(), trainee.optimizer_state(optimizer)  # collectives under fsdp
        if ranks.main:
            save_state(Path(state_dir), whole, state, step, config, seconds)

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
        with parallel.peers_watched(ranks):
            for step in bar:
                seconds = time.perf_counter() - clock
                due = heldout is not None and heldout.last_step != done and heldout.due(seconds)
                elapsed, due = parallel.agree(ranks, device, seconds, due)
                if due:  # rank 0 decides a plateau stop for every rank
                    stop = parallel.from_main(ranks, _evaluate(trainee, heldout, done, elapsed))
                if stop or (config.time_budget is not None and elapsed >= config.time_budget):
                    break
                for group in optimizer.param_groups:
                    group["lr"] = _lr_at(step, config, elapsed)
                loss = _step(trainee, draw, step, config, ranks, device)
                torch.nn.utils.clip_grad_norm_(trainee.params, 1.0)
                optimizer.step()
                loss_value = parallel.mean(ranks, loss)
                bar.set_postfix(loss=f"{loss_value:.3f}")
                if log is not None and ranks.main:
                    log(step + 1, loss_value, time.perf_counter() - clock)
                done = step + 1
                if state_dir is not None and done % config.save_every == 0:
                    save(done, time.perf_counter() - clock)
                    saved = done
            if state_dir is not None and done > saved:  # where a longer run resumes
                save(done, time.perf_counter() - clock)
            if evaluating and parallel.from_main(ranks, heldout is not None and heldout.last_step != done):
                _evaluate(trainee, heldout, done, time.perf_counter() - clock)
            whole = trainee.whole_drafter()
    except parallel.RankStopped as error:
        if state_dir is None or not saved:
            raise parallel.RankStopped(f"{error}; no training state was saved yet") from None
        raise parallel.RankStopped(
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
    parallel.barrier(ranks)  # every rank returns once the checkpoint is written
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
