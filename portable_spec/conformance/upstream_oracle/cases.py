"""The upstream-oracle cases: which drafter each upstream package builds, and what is compared.

Every case is a drafter on the fixture target (2 layers, the target's width, features of target layers 0, 1, 2);
the context is 32 positions, so every window (8 for blocks 4 and 8, 16 for block 16) is shorter than it. The
fixture target ties its embedding and head, so every case runs a tied-embedding target (speculators then reloads
its head from the embedding, `_load_verifier_weights`). `causal` is the package's own switch: z-lab's `is_causal`,
speculators' `not sliding_window_non_causal`; None leaves it unset (the package's default). `import_options` are
`portable-spec import`'s --window-rule / --block-attention for the cases that check them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PACKAGES = {  # package -> (version the worker is written against, the pins its venv takes)
    "dflash": ("0.1.0", "transformers==5.15.0"),
    "speculators": ("0.9.0", "transformers==5.19.0"),
    "specforge": ("0.2.0", "transformers==5.8.1"),
}
CONTEXT = 32  # context positions before the anchor
LAYER_IDS = [0, 1, 2]  # target layers whose output feeds fc (the fixture target has 4)
ALL_SLIDING = ["sliding_attention", "sliding_attention"]
MIXED = ["sliding_attention", "full_attention"]
YARN = {"factor": 4.0, "original_max_position_embeddings": 512}  # YaRN blends every frequency: any position differs


@dataclass(frozen=True)
class UpstreamCase:
    package: str
    name: str
    block_size: int = 8
    layer_types: list[str] | None = None
    causal: bool | None = None
    yarn: bool = False
    draft_vocab: int | None = None  # speculators only: a reduced vocabulary of this many target ids
    decode: bool = False  # z-lab only: its dflash_generate on the trained fixture drafter's weights
    import_options: dict = field(default_factory=dict)
    about: str = ""

    @property
    def id(self) -> str:
        return f"upstream/{self.package}/{self.name}"

    @property
    def sliding_window(self) -> int | None:
        return max(8, self.block_size) if self.layer_types and "sliding_attention" in self.layer_types else None

    def drafter(self, seed: int) -> dict:
        """The worker's description of the drafter (upstream terms, our layer-id convention)."""
        return {
            "name": self.name,
            "seed": seed,
            "block_size": self.block_size,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "intermediate_size": 512,
            "rope_theta": 10000.0,
            "target_layer_ids": LAYER_IDS,
            "mask_token_id": 1,
            "layer_types": self.layer_types,
            "sliding_window": self.sliding_window,
            "causal": self.causal,
            "yarn": YARN if self.yarn else None,
            "decode": {"max_new_tokens": 48} if self.decode else None,
        }


def _cases() -> list[UpstreamCase]:
    zlab, spec, forge = "dflash", "speculators", "specforge"
    return [
        UpstreamCase(zlab, "full_b4", 4, about="full attention, block bidirectional (is_causal unset)"),
        UpstreamCase(zlab, "full_b8", 8),
        UpstreamCase(zlab, "full_b16", 16),
        UpstreamCase(zlab, "full_causal", 8, causal=True, about="is_causal: true, every layer causal"),
        UpstreamCase(zlab, "mixed", 8, MIXED, about="sliding + full; unset is_causal: causal where sliding"),
        UpstreamCase(zlab, "sliding", 16, ALL_SLIDING),
        UpstreamCase(zlab, "sliding_bidirectional", 8, ALL_SLIDING, causal=False, about="is_causal: false"),
        UpstreamCase(zlab, "yarn", 8, yarn=True),
        UpstreamCase(zlab, "decode", 16, decode=True, about="dflash_generate, accepted length per round"),
        UpstreamCase(spec, "full_b4", 4),
        UpstreamCase(spec, "full_b16", 16),
        UpstreamCase(spec, "sliding_b8", 8, ALL_SLIDING, about="its trainer's default: every layer sliding"),
        UpstreamCase(spec, "sliding_b16", 16, ALL_SLIDING),
        UpstreamCase(spec, "mixed", 8, MIXED),
        UpstreamCase(spec, "sliding_non_causal", 8, ALL_SLIDING, causal=False, about="sliding_window_non_causal"),
        UpstreamCase(spec, "draft_vocab", 8, draft_vocab=512, about="512-id draft vocabulary: d2t/t2d, own lm_head"),
        UpstreamCase(spec, "yarn", 8, yarn=True),
        UpstreamCase(forge, "full_b4", 4),
        UpstreamCase(forge, "full_b16", 16),
        UpstreamCase(forge, "mixed", 8, MIXED, about="its trainer: causal + per-slot window where sliding"),
        UpstreamCase(forge, "sliding", 8, ALL_SLIDING),
        UpstreamCase(forge, "yarn", 8, yarn=True),
    ]


CASES = _cases()


def cases_of(package: str) -> list[UpstreamCase]:
    return [case for case in CASES if case.package == package]
