"""The shipped SmolLM2-135M-Instruct drafters and held-out ShareGPT prompts (portable_spec/assets/smollm2), made
by `portable-spec train` (see assets/smollm2/RECIPE.md); the target itself comes from `fetch-target smollm2`."""

from __future__ import annotations

import json
from pathlib import Path

from portable_spec.core.spec import SpecError

ASSETS = Path(__file__).parents[1] / "assets" / "smollm2"  # portable_spec/assets/smollm2
SHIPPED_KINDS = ("parallel", "depth_causal", "autoregressive")  # the kinds with a shipped SmolLM2 drafter


def drafter_dir(kind: str) -> Path:
    if kind not in SHIPPED_KINDS:
        raise SpecError(f"no SmolLM2 drafter {kind!r}; valid options: {', '.join(SHIPPED_KINDS)}")
    path = ASSETS / "drafters" / kind
    if not (path / "config.json").exists():
        raise SpecError(
            f"{path}: missing from this install; reinstall portable-spec (the drafters ship in the package)"
        )
    return path


def heldout_prompts() -> list[list[int]]:
    """Chat-templated first turns of held-out ShareGPT conversations (never used in training), as token ids."""
    return [entry["ids"] for entry in json.loads((ASSETS / "heldout_prompts.json").read_text())]


def manifest() -> dict:
    return json.loads((ASSETS / "MANIFEST.json").read_text())
