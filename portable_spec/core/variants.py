"""The one registry of drafter variants: how each kind shapes its block. No other module branches on names."""

from __future__ import annotations

from dataclasses import dataclass

from portable_spec.core.spec import VARIANT_KINDS, SpecError


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

    @property
    def single_pass(self) -> bool:
        """One drafter pass per round over [anchor, MASK...]: the shape the engines' DFlash proposers run."""
        return not self.autoregressive

    @property
    def cuttable(self) -> bool:
        """A block of any length <= block_size drafts exactly the prefix of the full block (causal in the block);
        otherwise the drafter must run the whole block it was trained on."""
        return self.block_causal

    @property
    def engine_native(self) -> bool:
        """Exactly DFlash's drafter, so an engine's own DFlash model class runs it unchanged."""
        return self.single_pass and not self.block_causal and not self.shift_mix


VARIANTS: dict[str, VariantBehaviour] = {
    "parallel": VariantBehaviour(block_causal=False, shift_mix=False, autoregressive=False),
    "depth_causal": VariantBehaviour(block_causal=True, shift_mix=True, autoregressive=False),
    "autoregressive": VariantBehaviour(block_causal=True, shift_mix=False, autoregressive=True),
}
assert tuple(VARIANTS) == VARIANT_KINDS


def single_pass_kinds() -> tuple[str, ...]:
    """The kinds an engine's DFlash proposer can serve (one pass per round)."""
    return tuple(kind for kind, behaviour in VARIANTS.items() if behaviour.single_pass)


def behaviour_of(kind: str) -> VariantBehaviour:
    try:
        return VARIANTS[kind]
    except KeyError:
        raise SpecError(f"variant {kind!r} is unknown; valid options: {', '.join(VARIANTS)}") from None
