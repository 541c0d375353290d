"""The one registry of drafter variants: how each kind shapes its block. No other module branches on names."""

from __future__ import annotations

from dataclasses import dataclass

from .spec import VARIANT_KINDS, SpecError


@dataclass(frozen=True)
class VariantBehaviour:
    """What distinguishes the drafter kinds; everything else is one code path.

    block_causal: slot j attends only to slots <= j (else the whole block sees itself, as DFlash).
    shift_mix: before each layer, slot j mixes in slot j-1's state: h_j <- W[h_j; h_{j-1}].
    autoregressive: one pass per draft token on real (drafted) tokens; slot j predicts token j+1.
      Otherwise slots hold [anchor, MASK...] and slot j predicts the token j places after the anchor.
    """

    block_causal: bool
    shift_mix: bool
    autoregressive: bool


VARIANTS: dict[str, VariantBehaviour] = {
    "parallel": VariantBehaviour(block_causal=False, shift_mix=False, autoregressive=False),
    "depth_causal": VariantBehaviour(block_causal=True, shift_mix=True, autoregressive=False),
    "autoregressive": VariantBehaviour(block_causal=True, shift_mix=False, autoregressive=True),
}
assert tuple(VARIANTS) == VARIANT_KINDS


def behaviour_of(kind: str) -> VariantBehaviour:
    try:
        return VARIANTS[kind]
    except KeyError:
        raise SpecError(f"variant {kind!r} is unknown; valid options: {', '.join(VARIANTS)}") from None
