"""A drafter's training state and where training starts from: a fresh drafter, a warm start (--init-from), or
the saved state of this run (resume). The state (drafter + AdamW + step + seconds) is saved atomically as
safetensors + JSON in the one-process layout, whatever the ranks and layouts (parallel.py), and a run resumes
only the run that saved it (RESUMABLE_CHANGES may change)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from portable_spec.core.drafter import Drafter, load_drafter
from portable_spec.core.outputs import write_dir_atomically
from portable_spec.core.spec import DrafterConfig, SpecError, read_config
from portable_spec.core.target import TargetModel
from portable_spec.training.config import TrainConfig
from portable_spec.training.work_dir import changed_settings

# a resumed run may train longer (in steps or seconds), save more often, or split and lay out the same global batch
# and drafter otherwise
RESUMABLE_CHANGES = ("steps", "save_every", "time_budget", "grad_accum", "drafter_parallel")


def save_state(state_dir: Path, drafter: Drafter, state: dict, step: int, config: TrainConfig, elapsed: float) -> None:
    """The whole drafter and its optimizer state (one-process layout, parallel.ShardedDrafter.optimizer_state)."""
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


def load_state(
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


def hold_depthwise(drafter: Drafter) -> Drafter:
    """--depthwise-shift-mix (issue 45 item 6): zero and freeze a dflash2's dynamic kernel projections and its
    selector. Each GroupedDynamicCausalConv then mixes slot i with slot i - 1 by its base taps alone, channel by
    channel (a depthwise version of depth_causal's dense shift-mix), and with zero codebooks and projection the
    selector's transition scores are 0, so it picks each slot's argmax: the checkpoint stays a plain dflash2 that
    speculators, vLLM, SGLang and llama.cpp read. Applied on every start (fresh, warm or resumed)."""
    held = [
        conv.kernel_projection.weight for layer in drafter.layers for conv in (layer.attention_conv, layer.mlp_conv)
    ]
    held += list(drafter.candidate_selector.parameters())
    with torch.no_grad():
        for param in held:
            param.zero_()
            param.requires_grad_(False)
    return drafter


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
