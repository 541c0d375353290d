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
# z-lab DFlash2's own switches (dflash_config), small enough for the fixture target (256 wide, vocabulary 512)
DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 32, "selector_top_k": 8}
DFLASH2_WIDE = {"conv_kernel_size": 3, "conv_group_size": 32, "selector_rank": 16, "selector_top_k": 16}
# SpecForge Domino's own switches (dflash_config), small for the fixture target
DOMINO = {"emb_dim": 64, "gru_hidden_dim": 32}
DOMINO_PREFIX = {"emb_dim": 48, "gru_hidden_dim": 16, "pure_draft_prefix_len": 2}
# speculators DSpark's own switches (from_training_args keywords): each Markov head, from the anchor or not
DSPARK = {"markov_rank": 32, "markov_head_type": "vanilla"}
DSPARK_GATED = {"markov_rank": 16, "markov_head_type": "gated", "sample_from_anchor": False}
DSPARK_RNN = {"markov_rank": 16, "markov_head_type": "rnn", "confidence_head_with_markov": False}
DSPARK_RNN_DFLASH = {"markov_rank": 32, "markov_head_type": "rnn", "sample_from_anchor": False}


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
    dflash2: dict | None = None  # a DFlash2DraftModel (z-lab, speculators) with these switches (seeded convs, selector)
    dspark: dict | None = None  # speculators only: a DSparkDraftModel with these switches (seeded heads)
    domino: dict | None = None  # specforge only: a DominoDraftModel with these switches (seeded GRU and projection)
    import_options: dict = field(default_factory=dict)
    about: str = ""

    @property
    def id(self) -> str:
        return f"upstream/{self.package}/{self.name}"

    @property
    def kind(self) -> str:
        """The portable kind the case imports as."""
        return "dflash2" if self.dflash2 else "dspark" if self.dspark else "domino" if self.domino else "parallel"

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
            "dflash2": self.dflash2,
            "dspark": self.dspark,
            "domino": self.domino,
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
        UpstreamCase(zlab, "dflash2_b8", 8, dflash2=DFLASH2, about="DFlash2DraftModel: convolutions and selector"),
        UpstreamCase(zlab, "dflash2_k3_causal", 4, causal=True, dflash2=DFLASH2_WIDE, about="DFlash2, 3 taps, causal"),
        UpstreamCase(zlab, "dflash2_mixed", 8, MIXED, dflash2=DFLASH2, about="DFlash2 with sliding + full layers"),
        UpstreamCase(zlab, "dflash2_decode", 16, decode=True, dflash2=DFLASH2, about="DFlash2 in dflash_generate"),
        UpstreamCase(spec, "full_b4", 4),
        UpstreamCase(spec, "full_b16", 16),
        UpstreamCase(spec, "sliding_b8", 8, ALL_SLIDING, about="its trainer's default: every layer sliding"),
        UpstreamCase(spec, "sliding_b16", 16, ALL_SLIDING),
        UpstreamCase(spec, "mixed", 8, MIXED),
        UpstreamCase(spec, "sliding_non_causal", 8, ALL_SLIDING, causal=False, about="sliding_window_non_causal"),
        UpstreamCase(spec, "draft_vocab", 8, draft_vocab=512, about="512-id draft vocabulary: d2t/t2d, own lm_head"),
        UpstreamCase(spec, "yarn", 8, yarn=True),
        UpstreamCase(spec, "dflash2_b8", 8, dflash2=DFLASH2, about="its DFlash2DraftModel: convolutions and selector"),
        UpstreamCase(spec, "dflash2_sliding", 8, ALL_SLIDING, dflash2=DFLASH2, about="DFlash2, its trainer's sliding"),
        UpstreamCase(spec, "dspark_b8", 8, dspark=DSPARK, about="its DSparkDraftModel: Markov head, confidence head"),
        UpstreamCase(spec, "dspark_gated", 4, dspark=DSPARK_GATED, about="DSpark, gated head, not from the anchor"),
        UpstreamCase(spec, "dspark_rnn", 8, ALL_SLIDING, dspark=DSPARK_RNN, about="DSpark, rnn head, sliding layers"),
        UpstreamCase(spec, "dspark_rnn_dflash", 8, dspark=DSPARK_RNN_DFLASH, about="DSpark, rnn, not from the anchor"),
        UpstreamCase(spec, "dspark_vocab", 8, draft_vocab=512, dspark=DSPARK, about="DSpark, 512-id draft vocabulary"),
        UpstreamCase(forge, "full_b4", 4),
        UpstreamCase(forge, "full_b16", 16),
        UpstreamCase(forge, "mixed", 8, MIXED, about="its trainer: causal + per-slot window where sliding"),
        UpstreamCase(forge, "sliding", 8, ALL_SLIDING),
        UpstreamCase(forge, "yarn", 8, yarn=True),
        UpstreamCase(forge, "domino_b8", 8, domino=DOMINO, about="its DominoDraftModel: GRU correction head"),
        UpstreamCase(forge, "domino_prefix", 8, MIXED, domino=DOMINO_PREFIX, about="Domino, 2 uncorrected slots"),
        UpstreamCase(forge, "domino_b4", 4, domino=DOMINO, about="Domino at block 4"),
    ]


CASES = _cases()


def cases_of(package: str) -> list[UpstreamCase]:
    return [case for case in CASES if case.package == package]
