"""Which target, drafters and prompts a demo or benchmark runs: the real SmolLM2 target (default) or the tiny
fixtures (`--target fixture`, seconds instead of minutes)."""

from __future__ import annotations

from dataclasses import dataclass

from . import fixtures, real_assets
from .drafter import Drafter
from .spec import VARIANT_KINDS
from .target import TargetModel

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


def load_setup(which: str, kinds: list[str] = list(VARIANT_KINDS)) -> BenchSetup:
    if which == "fixture":
        target = TargetModel.load(fixtures.target_dir())
        drafters = {kind: target.load_drafter(fixtures.drafter_dir(kind)) for kind in kinds}
        return BenchSetup(which, target, drafters, fixtures.heldout_prompts(), (),
                          f"fixture target {fixtures.target_dir()} (held-out Python stdlib prompts)")
    from transformers import AutoTokenizer

    from .real_target import fetch_target

    target_dir = fetch_target(which)
    target = TargetModel.load(target_dir)
    drafters = {kind: target.load_drafter(real_assets.drafter_dir(kind)) for kind in kinds}
    eos = AutoTokenizer.from_pretrained(str(target_dir)).eos_token_id
    return BenchSetup(which, target, drafters, real_assets.heldout_prompts(), (eos,),
                      "SmolLM2-135M-Instruct (held-out ShareGPT prompts, chat template, stop at <|im_end|>)",
                      default_num_drafts=3)  # block 4: the fastest block on a 2-core CPU (docs/benchmarks/smollm2)


def param_count(target: TargetModel) -> float:
    return sum(p.numel() for p in target.model.parameters()) / 1e6
