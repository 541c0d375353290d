"""The registry of drafter variants by kind name, read from the variant classes in spec.py (each carries its
behaviour): how each kind shapes its block. No other module branches on names."""

from __future__ import annotations

from portable_spec.core.spec import VARIANT_CLASSES, SpecError, VariantBehaviour

VARIANTS: dict[str, VariantBehaviour] = {cls.model_fields["kind"].default: cls.behaviour for cls in VARIANT_CLASSES}


def dflash_shaped_kinds() -> tuple[str, ...]:
    """The kinds an engine's DFlash proposer can serve (one pass per round, DFlash's layers and greedy head)."""
    return tuple(kind for kind, behaviour in VARIANTS.items() if behaviour.dflash_shaped)


def behaviour_of(kind: str) -> VariantBehaviour:
    try:
        return VARIANTS[kind]
    except KeyError:
        raise SpecError(f"variant {kind!r} is unknown; valid options: {', '.join(VARIANTS)}") from None
