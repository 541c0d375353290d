"""Checks every engine adapter makes of a portable checkpoint the same way, with the engine's name in the message."""

from __future__ import annotations

from portable_spec.spec import DrafterConfig, SpecError


def refuse_reduced_vocabulary(config: DrafterConfig, source: str, engine: str) -> None:
    """The engines' DFlash drafters need their own draft-vocabulary lm_head; a portable checkpoint shares the
    target's, and the adapters do not slice it at load time yet."""
    if config.draft_vocab_size is not None:
        raise SpecError(
            f"{source}: draft_vocab_size={config.draft_vocab_size}: {engine}'s DFlash drafter needs its own "
            "draft-vocabulary lm_head, and a portable checkpoint shares the target's; this adapter does not slice it "
            "yet. fix: serve a full-vocabulary drafter (`portable-spec train --draft-vocab-size 0`), or run this one "
            "with `portable-spec generate` (reference and ONNX backends)"
        )
