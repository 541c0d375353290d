"""Which target, drafters and prompts a demo or benchmark runs: the real SmolLM2 target (default) or the tiny
fixtures (`--target fixture`, seconds instead of minutes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from portable_spec.core import fixtures, real_assets
from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import VARIANT_KINDS
from portable_spec.core.target import TargetModel

TARGET_CHOICES = ("smollm2", "fixture")


@dataclass
class BenchSetup:
    name: str
    target: TargetModel
    drafters: dict[str, Drafter]
    prompts: list[list[int]]
    stop_token_ids: tuple[int, ...]
    describe: str
    default_num_drafts: int = 7
    default_confidence: float = 0.0


def load_setup(
    which: str,
    kinds: tuple[str, ...] | None = None,
    device: str = "cpu",
    drafter_dirs: dict[str, Path] | None = None,
    dtype: torch.dtype = torch.float32,
) -> BenchSetup:
    """The target on `device` in `dtype` and its drafters (in the same dtype): the shipped ones of `kinds` (default:
    every kind shipped for it), or `drafter_dirs` (row name -> checkpoint directory) instead, e.g. freshly trained
    drafters beside the shipped ones."""

    def drafters_for(target: TargetModel, shipped, shipped_kinds) -> dict[str, Drafter]:
        dirs = drafter_dirs if drafter_dirs else {kind: shipped(kind) for kind in kinds or shipped_kinds}
        return {name: target.load_drafter(path).to(device) for name, path in dirs.items()}

    if which == "fixture":
        target = TargetModel.load(fixtures.target_dir(), dtype=dtype)
        target.model.to(device)
        drafters = drafters_for(target, fixtures.drafter_dir, VARIANT_KINDS)
        return BenchSetup(
            which,
            target,
            drafters,
            fixtures.heldout_prompts(),
            (),
            f"fixture target {fixtures.target_dir()} (held-out Python stdlib prompts)",
        )
    from portable_spec.core.real_target import fetch_target

    target = TargetModel.load(fetch_target(which), dtype=dtype, tokenizer=True)
    target.model.to(device)
    drafters = drafters_for(target, real_assets.drafter_dir, real_assets.SHIPPED_KINDS)
    eos = target.tokenizer.eos_token_id
    return BenchSetup(
        which,
        target,
        drafters,
        real_assets.heldout_prompts(),
        (eos,),
        "SmolLM2-135M-Instruct (held-out ShareGPT prompts, chat template, stop at <|im_end|>)",
        default_num_drafts=3,
    )  # block 4: the fastest block on a 2-core CPU (docs/benchmarks/smollm2)


def device_name(device: torch.device) -> str:
    """What a benchmark header says it ran on."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    from portable_spec.core.matmul_layout import cpu_description

    return f"{cpu_description()}, {torch.get_num_threads()} CPU threads (torch {torch.__version__})"


def param_count(target: TargetModel) -> float:
    return sum(p.numel() for p in target.model.parameters()) / 1e6
