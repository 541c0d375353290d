"""The portable drafter checkpoint format: `config.json` validated by these pydantic models.

Every backend reads this one file; nothing engine-specific is stored in it. Layer-id convention:
`target_layer_ids` holds i such that the feature is the OUTPUT of target decoder layer i, which is
HF `output_hidden_states[i + 1]` and the state ENTERING layer i + 1 (what vLLM/SGLang capture).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from portable_spec.core.errors import validation_line

FORMAT_VERSION = 1
MAX_BLOCK_SIZE = 64
MAX_POSITION_EMBEDDINGS = 32768  # written for engines that size rotary tables from it
MAX_SLIDING_WINDOW = 2**31 - 1  # wider reaches no further in any context; 2**63 overflowed generate and the ONNX export


class SpecError(ValueError):
    """A drafter config or checkpoint that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class VariantBehaviour:
    """What distinguishes the drafter kinds; everything else is one code path.

    block_causal: slot j attends only to slots <= j in every layer (the parallel kind chooses per config:
      DrafterConfig.layer_attention).
    shift_mix: before each layer, slot j mixes in slot j-1's state: h_j <- W[h_j; h_{j-1}].
    autoregressive: one pass per draft token on real (drafted) tokens; slot j predicts token j+1.
      Otherwise slots hold [anchor, MASK...] and slot j predicts the token j places after the anchor.
    sublayer_conv: around every attention and MLP sublayer, a grouped dynamic causal convolution along the block
      (DFlash2's `GroupedDynamicCausalConv`: the sublayer's input convolved before it, its output after).
    candidate_selector: drafts are picked slot after slot from each slot's top-k logits, re-scored by low-rank
      bigram codebooks given the token picked before (DFlash2's `CandidateSelector`).
    markov_head: each slot's logits get a low-rank bias from the token before it in the block (teacher-forced in
      training, the slot before's draft when decoding), and a confidence head predicts each slot's acceptance
      (DSpark's `MarkovHead` and `ConfidenceHead`).
    gru_head: each slot's logits get a correction from a GRU over the block's tokens before it and the slot's state
      (Domino's `prefix_gru` and `embed_proj`).
    """

    block_causal: bool
    shift_mix: bool
    autoregressive: bool
    sublayer_conv: bool = False
    candidate_selector: bool = False
    markov_head: bool = False
    gru_head: bool = False
    extras: str = ""  # what the kind computes beyond DFlash's layers and greedy head, in words (refusals name it)

    @property
    def sequential_head(self) -> bool:
        """Drafts picked slot after slot, each given the one before (DFlash2's selector, DSpark's Markov head)."""
        return self.candidate_selector or self.markov_head or self.gru_head

    @property
    def single_pass(self) -> bool:
        """One drafter pass per round over [anchor, MASK...]: the shape the engines' DFlash proposers run."""
        return not self.autoregressive

    @property
    def full_vocabulary(self) -> bool:
        """Scores every target token: DFlash2's codebooks and Domino's correction have one row per token."""
        return self.candidate_selector or self.gru_head

    @property
    def dflash_shaped(self) -> bool:
        """DFlash's layers and greedy head, whatever the block's attention and shift-mix: what an engine's DFlash
        proposer runs, natively or through portable-spec's plugins (DFlash2's convolutions and selector are not)."""
        return self.single_pass and not self.sublayer_conv and not self.sequential_head

    @property
    def engine_native(self) -> bool:
        """Exactly DFlash's drafter, so an engine's own DFlash model class runs it unchanged."""
        return self.dflash_shaped and not self.block_causal and not self.shift_mix


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


BLOCK_ATTENTION = ("bidirectional", "causal", "causal_in_sliding_layers")


class _VariantFields(_Strict):
    """What every variant config has beyond its fields: the keys the engines' own loaders read for the kind."""

    def engine_keys(self) -> dict[str, Any]:
        """Keys written into config.json beside ours (engine_fields) so an engine's converter or loader for the
        kind reads the checkpoint; a nested `dflash_config` is merged into DFlash's."""
        return {}


class ParallelVariant(_VariantFields):
    """DFlash-style: one pass over [anchor, MASK...], no shift-mix. The block slots attend to each other
    bidirectionally (DFlash), or causally in every layer (z-lab `is_causal: true`; speculators 0.9.0's trainer
    default, whose layers all slide), or causally in the sliding-window layers only (z-lab `dflash` 0.1.0
    dflash/model.py with `is_causal` unset, SpecForge 0.2.0's trainer, vLLM 0.32 `_dflash_layer_causal`)."""

    kind: Literal["parallel"] = "parallel"
    engine_architecture: ClassVar[str] = "DFlashDraftModel"  # native in vLLM, SGLang, TensorRT-LLM >= 1.3
    behaviour: ClassVar[VariantBehaviour] = VariantBehaviour(block_causal=False, shift_mix=False, autoregressive=False)
    block_attention: Literal[BLOCK_ATTENTION] = Field(
        "bidirectional", description="How block slots see each other: " + " | ".join(BLOCK_ATTENTION) + "."
    )


class DepthCausalVariant(_VariantFields):
    """Ours: one pass, causal block attention, and before every layer slot j mixes in slot j-1's state."""

    kind: Literal["depth_causal"] = "depth_causal"
    engine_architecture: ClassVar[str] = "DFlashDepthCausalDraftModel"  # registered by our engine plugins
    behaviour: ClassVar[VariantBehaviour] = VariantBehaviour(block_causal=True, shift_mix=True, autoregressive=False)
    shift_mix_layers: Literal["all"] = Field(
        "all", description="Layers that apply the shift-mix h_j <- W[h_j; h_{j-1}]; 'all' is the only option."
    )


class AutoregressiveVariant(_VariantFields):
    """EAGLE-style baseline: one drafter pass per draft token, fed its own previous drafts."""

    kind: Literal["autoregressive"] = "autoregressive"
    engine_architecture: ClassVar[str] = "PortableSpecAutoregressiveDraft"  # reference/ONNX only
    behaviour: ClassVar[VariantBehaviour] = VariantBehaviour(block_causal=True, shift_mix=False, autoregressive=True)


class DFlash2Variant(_VariantFields):
    """z-lab's DFlash2 (`dflash` 0.1.0 dflash/model.py `DFlash2DraftModel`; vllm-project/speculators 0.9.0
    models/dflash2): DFlash's one pass over [anchor, MASK...] with a grouped dynamic causal convolution along the
    block around every attention and MLP sublayer, and a candidate selector that picks each slot's draft from its
    top-k logits given the draft before it. The block's attention is DFlash's (block_attention)."""

    kind: Literal["dflash2"] = "dflash2"
    engine_architecture: ClassVar[str] = "DFlash2DraftModel"  # vLLM, SGLang and llama.cpp serve it natively
    behaviour: ClassVar[VariantBehaviour] = VariantBehaviour(
        block_causal=False,
        shift_mix=False,
        autoregressive=False,
        sublayer_conv=True,
        candidate_selector=True,
        extras="convolutions around its sublayers and a candidate selector",
    )
    block_attention: Literal[BLOCK_ATTENTION] = Field(
        "bidirectional", description="How block slots see each other: " + " | ".join(BLOCK_ATTENTION) + "."
    )
    conv_kernel_size: int = Field(2, ge=1, le=MAX_BLOCK_SIZE, description="Causal taps of each convolution.")
    conv_group_size: int = Field(16, ge=1, description="Hidden channels sharing one dynamic kernel coefficient.")
    selector_rank: int = Field(256, ge=1, description="Rank of the selector's bigram codebooks.")
    selector_top_k: int = Field(16, ge=1, description="Candidates per slot the selector re-scores.")

    def engine_keys(self) -> dict[str, Any]:
        """z-lab's DFlash2 keeps its switches in dflash_config (what llama.cpp's convert_hf_to_gguf.py b11434
        `DFlashModel` and vLLM's DFlash2 loader read)."""
        keys = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
        return {"dflash_config": {key: getattr(self, key) for key in keys}}


MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


class DSparkVariant(_VariantFields):
    """vllm-project/speculators 0.9.0's DSpark (models/dspark): DFlash's one pass, then a Markov head that biases
    each slot's logits by the token before it in the block (vanilla: a low-rank bigram W2 W1[prev]; gated: times a
    gate from the slot's hidden state; rnn: through a recurrent state over the block) and a confidence head that
    predicts each slot's acceptance (a linear map of the slot's hidden state, with the previous token's Markov
    embedding when confidence_head_with_markov). With sample_from_anchor the anchor's slot drafts too: slot j
    predicts the token j + 1 places after the anchor and a block of k slots drafts k tokens."""

    kind: Literal["dspark"] = "dspark"
    engine_architecture: ClassVar[str] = "DSparkDraftModel"  # vLLM (PR #47093), SGLang and llama.cpp serve it
    behaviour: ClassVar[VariantBehaviour] = VariantBehaviour(
        block_causal=False,
        shift_mix=False,
        autoregressive=False,
        markov_head=True,
        extras="a Markov head biasing each slot by the draft before it and a confidence head",
    )
    block_attention: Literal[BLOCK_ATTENTION] = Field(
        "bidirectional", description="How block slots see each other: " + " | ".join(BLOCK_ATTENTION) + "."
    )
    sample_from_anchor: bool = Field(
        True, description="The anchor's slot drafts the token after it (speculators' DSpark default); false: DFlash's."
    )
    markov_rank: int = Field(256, ge=1, description="Rank of the Markov logit bias W2 W1.")
    markov_head_type: Literal[MARKOV_HEAD_TYPES] = Field(
        "vanilla", description="Markov head: " + " | ".join(MARKOV_HEAD_TYPES) + "."
    )
    confidence_head: bool = Field(True, description="Carries the per-slot acceptance predictor.")
    confidence_head_with_markov: bool = Field(
        True, description="The confidence head also reads the previous token's Markov embedding."
    )

    def engine_keys(self) -> dict[str, Any]:
        """speculators' DSpark keys at the top level: what llama.cpp's convert_hf_to_gguf.py b11434 `DSparkModel`
        reads (sample_from_anchor, markov_head_type) and vLLM 0.32's `Qwen3DSparkModel` (markov_rank,
        enable_confidence_head, confidence_head_with_markov)."""
        keys = ("sample_from_anchor", "markov_rank", "markov_head_type", "confidence_head_with_markov")
        return {"enable_confidence_head": self.confidence_head, **{key: getattr(self, key) for key in keys}}


class DominoVariant(_VariantFields):
    """SpecForge 0.2.0's Domino (specforge/modeling/draft/domino.py `DominoDraftModel`, vLLM's
    `dflash_config.projector_type = "domino"`): DFlash's one pass, then each slot after the first
    pure_draft_prefix_len adds embed_proj([h_s ; GRU(target embeddings of the block's tokens before it)]) to its
    logits: a causal correction head, drafts picked slot after slot. Full vocabulary (embed_proj scores every token)."""

    kind: Literal["domino"] = "domino"
    engine_architecture: ClassVar[str] = "DominoDraftModel"  # SpecForge's class; vLLM and SGLang serve Domino
    behaviour: ClassVar[VariantBehaviour] = VariantBehaviour(
        block_causal=False,
        shift_mix=False,
        autoregressive=False,
        gru_head=True,
        extras="a GRU over the block's tokens correcting each slot's logits",
    )
    block_attention: Literal[BLOCK_ATTENTION] = Field(
        "bidirectional", description="How block slots see each other: " + " | ".join(BLOCK_ATTENTION) + "."
    )
    emb_dim: int = Field(
        512, ge=1, description="Width of the correction MLP (SpecForge's emb_dim; it has no default: this is ours)."
    )
    gru_hidden_dim: int = Field(
        256, ge=1, description="GRU state width (SpecForge's gru_hidden_dim; it has no default: this is ours)."
    )
    pure_draft_prefix_len: int = Field(0, ge=0, description="Draft slots after the anchor left uncorrected.")


VARIANT_CLASSES = (
    ParallelVariant, DepthCausalVariant, AutoregressiveVariant, DFlash2Variant, DSparkVariant, DominoVariant
)  # fmt: skip
Variant = Annotated[
    Union[ParallelVariant, DepthCausalVariant, AutoregressiveVariant, DFlash2Variant, DSparkVariant, DominoVariant],
    Field(discriminator="kind"),
]
VARIANT_KINDS = tuple(cls.model_fields["kind"].default for cls in VARIANT_CLASSES)


class TargetBinding(_Strict):
    """Which target the drafter was trained for; checked against the served target at load time."""

    model_id: str = Field(description="Name or path of the target the drafter was distilled from.")
    architecture: str = Field(description="HF architecture class of the target, e.g. Qwen3ForCausalLM.")
    hidden_size: int = Field(gt=0, description="Target hidden size; features are len(target_layer_ids) * this.")
    num_hidden_layers: int = Field(gt=0, description="Target decoder layer count.")
    vocab_size: int = Field(gt=0, description="Target vocabulary size (embedding rows).")
    fingerprint: str = Field(
        pattern=r"^sha256:[0-9a-f]{64}$",
        description="sha256 of the target's embedding and LM head rounded to bf16 (see binding.py).",
    )


LAYER_TYPES = ("full_attention", "sliding_attention")
# Where a sliding layer's window is measured from; what each upstream trainer computes (read from its source):
# - per_slot: each block slot at position p sees context keys k with p - k < W (transformers' sliding windows;
#   z-lab `dflash` 0.1.0 dflash/model.py `_attention_mask`; SpecForge 0.2.0 trainer
#   algorithms/common/dflash_family_model.py `create_dflash_sdpa_mask`; vLLM and SGLang serve every DFlash
#   drafter this way);
# - per_anchor: every slot of a block sees the same context keys k >= anchor - W (speculators 0.9.0 trainer,
#   models/dflash/attention.py `create_anchor_block_mask_mod.base_prefix_mod`), so slot j sees j + 1 positions
#   more than per_slot gives it.
WINDOW_RULES = ("per_slot", "per_anchor")


class YarnScaling(_Strict):
    """YaRN rotary scaling as transformers' Qwen3 (`_compute_yarn_parameters`), vLLM and SGLang compute it:
    frequencies blended between interpolated (/ factor) and extrapolated ones over the correction range set by
    beta_fast/beta_slow at original_max_position_embeddings, cos/sin scaled by attention_factor (default
    0.1 ln(factor) + 1)."""

    rope_type: Literal["yarn"] = "yarn"
    factor: float = Field(gt=0, allow_inf_nan=False, description="Context extension factor.")
    original_max_position_embeddings: int = Field(gt=0, description="Context length the rotary was trained at.")
    beta_fast: float = Field(32.0, gt=0, allow_inf_nan=False)
    beta_slow: float = Field(1.0, gt=0, allow_inf_nan=False)
    attention_factor: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="cos/sin scale; None: 0.1 ln(factor) + 1."
    )


@dataclass(frozen=True)
class LayerAttention:
    """What one drafter layer's block queries see: every context position (window None) or a window of them
    (`window_per_anchor` False: less than `window` positions behind the query's own, q_pos - k_pos < window;
    True: at most `window` positions behind the block's anchor, k_pos >= anchor - window, the same for every
    slot: WINDOW_RULES), and, inside the block, only earlier slots (block_causal) or every slot."""

    window: int | None
    block_causal: bool
    window_per_anchor: bool = False


def layer_attention_problem(
    layer_types: list[str] | None,
    sliding_window: int | None,
    num_hidden_layers: int,
    block_size: int,
    block_attention: str | None = None,
    window_rule: str | None = None,
) -> str | None:
    """What is wrong with a drafter's sliding layers, or None: the rules of DrafterConfig, also what the importer
    checks before a target loads."""
    if layer_types is not None and len(layer_types) != num_hidden_layers:
        return (
            f"layer_types has {len(layer_types)} entries but num_hidden_layers={num_hidden_layers}; "
            "give one per drafter layer"
        )
    sliding = layer_types is not None and "sliding_attention" in layer_types
    if sliding and sliding_window is None:
        return "layer_types has sliding_attention layers but no sliding_window; set the window size"
    if not sliding and sliding_window is not None:
        return (
            f"sliding_window={sliding_window} but no layer is sliding_attention; drop sliding_window, or list the "
            "sliding layers in layer_types"
        )
    if sliding and sliding_window > MAX_SLIDING_WINDOW:
        return (
            f"sliding_window={sliding_window} is past {MAX_SLIDING_WINDOW}, the widest window positions can measure "
            "(it overflowed generate and the ONNX export); for layers that see every position use full_attention"
        )
    if sliding and sliding_window < block_size:
        return (
            f"sliding_window={sliding_window} is smaller than block_size={block_size}; a window must hold the whole "
            "block (engines disagree on windows inside the block)"
        )
    if window_rule not in (None, "per_slot") and not sliding:
        return f"window_rule={window_rule} but no layer is sliding_attention; drop window_rule"
    if block_attention == "causal_in_sliding_layers" and not sliding:
        return (
            "variant.block_attention=causal_in_sliding_layers needs sliding_attention layers in layer_types; use "
            "bidirectional or causal"
        )
    return None


def _config_value(field: str, value) -> str:
    return f"variant.{field}={value}" if field in DFlash2Variant.model_fields else f"{field}={value}"


def dflash2_problem(
    variant: "DFlash2Variant", hidden_size: int, vocab_size: int, block_size: int, shown=_config_value
) -> str | None:
    """What is wrong with a dflash2 variant for a drafter of this width, vocabulary and block, or None: the rules
    of DrafterConfig, also what `portable-spec train` checks from the target's config.json before any weights load
    (`shown(field, value)` names each field as the caller's user wrote it). speculators 0.9.0 models/dflash2/core.py
    and model_definitions.py refuse the same."""
    if hidden_size % variant.conv_group_size:
        return (
            f"{shown('conv_group_size', variant.conv_group_size)} does not divide "
            f"{shown('hidden_size', hidden_size)}; pick a divisor"
        )
    if variant.conv_kernel_size > block_size:
        return (
            f"{shown('conv_kernel_size', variant.conv_kernel_size)} is wider than {shown('block_size', block_size)}; "
            "a convolution along the block has at most block_size taps"
        )
    if variant.selector_top_k > vocab_size:
        return f"{shown('selector_top_k', variant.selector_top_k)} exceeds {shown('vocab_size', vocab_size)}; use fewer"
    return None


def drafts_from_anchor(variant: Variant) -> bool:
    """Slot j predicts the token j + 1 places after the anchor (the autoregressive kind; a dspark with
    sample_from_anchor), not j places."""
    return variant.behaviour.autoregressive or getattr(variant, "sample_from_anchor", False)


def max_draft_tokens(variant: Variant, block_size: int) -> int:
    """Drafts one block of `block_size` slots proposes: every slot's when the anchor's slot drafts in one pass
    (dspark), else one fewer (the autoregressive kind writes each draft into the next slot)."""
    single_pass_from_anchor = drafts_from_anchor(variant) and not variant.behaviour.autoregressive
    return block_size if single_pass_from_anchor else block_size - 1


class DrafterConfig(_Strict):
    """Everything needed to rebuild the drafter; `model.safetensors` holds only drafter-owned weights."""

    format_version: Literal[1] = Field(FORMAT_VERSION, description="Checkpoint format version.")
    variant: Variant = Field(description="Drafter kind: " + " | ".join(VARIANT_KINDS) + ".")
    block_size: int = Field(
        ge=2, le=MAX_BLOCK_SIZE, description="Slots per block: the anchor plus block_size-1 draft tokens."
    )
    num_hidden_layers: int = Field(ge=1, le=64, description="Drafter decoder layers.")
    hidden_size: int = Field(
        gt=0, description="Drafter width: the target's, or another with own_embeddings (features enter through fc)."
    )
    num_attention_heads: int = Field(gt=0, description="Query heads.")
    num_key_value_heads: int = Field(gt=0, description="KV heads; must divide num_attention_heads.")
    head_dim: int = Field(gt=0, description="Per-head width; even, for rotary embedding.")
    intermediate_size: int = Field(gt=0, description="SwiGLU MLP width.")
    rms_norm_eps: float = Field(1e-6, gt=0, allow_inf_nan=False, description="RMSNorm epsilon.")
    rope_theta: float = Field(10000.0, gt=0, allow_inf_nan=False, description="Rotary base.")
    rope_scaling: YarnScaling | None = Field(None, description="Rotary scaling: YaRN, or None (plain rotary).")
    vocab_size: int = Field(gt=0, description="Vocabulary size; must equal the target's.")
    mask_token_id: int = Field(ge=0, description="Token id filling the draft slots of a block.")
    draft_vocab_size: int | None = Field(
        None,
        gt=0,
        description="Rows of the target's LM head the drafter scores (EAGLE-3's reduced draft vocabulary; "
        "weights carry `d2t`: target id = draft id + d2t[draft id]); None scores the full vocabulary.",
    )
    target_layer_ids: list[int] = Field(
        min_length=1, description="Target layers whose OUTPUT is fused (HF output_hidden_states[i + 1])."
    )
    target: TargetBinding = Field(description="The target this drafter was trained for.")
    own_embeddings: bool = Field(
        False,
        description="The checkpoint carries the drafter's own `embed_tokens` [vocab_size, hidden_size] and "
        "`lm_head` [draft_vocab_size or vocab_size, hidden_size]; false: it embeds and scores with the target's. "
        "Required when hidden_size differs from the target's.",
    )
    layer_types: list[Literal[LAYER_TYPES]] | None = Field(
        None,
        description="Per drafter layer: full_attention (every context position) or sliding_attention (the last "
        "`sliding_window` positions); omitted: all full.",
    )
    sliding_window: int | None = Field(
        None,
        ge=1,
        le=MAX_SLIDING_WINDOW,
        description="Window of the sliding_attention layers, in positions; set iff any layer slides.",
    )
    window_rule: Literal[WINDOW_RULES] = Field(
        "per_slot",
        description="Where a sliding window is measured from: per_slot (each slot's own position, q - k < W: "
        "transformers, z-lab, SpecForge, vLLM, SGLang) or per_anchor (the block's anchor, k >= anchor - W for "
        "every slot: speculators' trainer). Only with sliding layers; written only when per_anchor.",
    )

    @model_validator(mode="before")
    @classmethod
    def _canonical_layer_types(cls, data: Any) -> Any:
        """All-full layer_types is the default, stored as omitted, so one drafter has one config."""
        if isinstance(data, dict) and isinstance(data.get("layer_types"), list):
            if all(kind == "full_attention" for kind in data["layer_types"]):
                data = {key: value for key, value in data.items() if key != "layer_types"}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> "DrafterConfig":
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; pick a divisor"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embedding")
        if self.mask_token_id >= self.vocab_size:
            raise ValueError(
                f"mask_token_id={self.mask_token_id} is outside the vocabulary (vocab_size={self.vocab_size}); "
                "use a reserved special token of the target tokenizer"
            )
        if self.draft_vocab_size is not None and self.draft_vocab_size > self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} exceeds vocab_size={self.vocab_size}; "
                "use at most the target's vocabulary, or omit it for the full vocabulary"
            )
        if self.vocab_size != self.target.vocab_size:
            raise ValueError(
                f"vocab_size={self.vocab_size} differs from target.vocab_size={self.target.vocab_size}; "
                "drafts are target tokens, so they must be equal"
            )
        if self.hidden_size != self.target.hidden_size and not self.own_embeddings:
            raise ValueError(
                f"hidden_size={self.hidden_size} differs from target.hidden_size={self.target.hidden_size} but "
                "own_embeddings is false; a drafter of another width cannot use the target's embedding and LM head: "
                "set own_embeddings: true and ship embed_tokens and lm_head"
            )
        self._check_layer_attention()
        self._check_dflash2()
        self._check_domino()
        ids = self.target_layer_ids
        if sorted(set(ids)) != ids:
            raise ValueError(f"target_layer_ids={ids} must be strictly increasing with no repeats")
        last_usable = self.target.num_hidden_layers - 2
        if ids[0] < 0 or ids[-1] > last_usable:
            raise ValueError(
                f"target_layer_ids={ids} must lie in [0, {last_usable}] "
                f"(target.num_hidden_layers={self.target.num_hidden_layers}); the last layer is excluded "
                "because HF reports it after the final norm and engines capture states entering a layer"
            )
        return self

    def _check_layer_attention(self) -> None:
        problem = layer_attention_problem(
            self.layer_types,
            self.sliding_window,
            self.num_hidden_layers,
            self.block_size,
            getattr(self.variant, "block_attention", None),
            self.window_rule,
        )
        if problem:
            raise ValueError(problem)

    def _check_dflash2(self) -> None:
        """What DFlash2's convolutions and selector need of the drafter's shape (dflash2_problem), and its full
        vocabulary."""
        variant = self.variant
        if not isinstance(variant, DFlash2Variant):
            return
        problem = dflash2_problem(variant, self.hidden_size, self.vocab_size, self.block_size)
        if problem:
            raise ValueError(problem)
        if self.draft_vocab_size is not None:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size}: a dflash2 drafter scores the full vocabulary (its "
                "selector's codebooks are indexed by target ids; speculators 0.9.0 refuses a reduced one too); omit it"
            )

    def _check_domino(self) -> None:
        """A domino's correction scores the full vocabulary and leaves at most every draft slot uncorrected."""
        variant = self.variant
        if not isinstance(variant, DominoVariant):
            return
        if self.draft_vocab_size is not None:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size}: a domino drafter scores the full vocabulary (its "
                "embed_proj has one row per target token, as SpecForge 0.2.0 builds it); omit it"
            )
        if variant.pure_draft_prefix_len > self.block_size - 1:
            raise ValueError(
                f"variant.pure_draft_prefix_len={variant.pure_draft_prefix_len} exceeds the block's "
                f"{self.block_size - 1} draft slots (block_size={self.block_size}); use at most that many"
            )

    @property
    def kind(self) -> str:
        return self.variant.kind

    def layer_attention(self, layer: int) -> LayerAttention:
        """The one rule for what layer `layer`'s block queries see (the reference, ONNX graph and engine configs all
        follow it)."""
        sliding = self.layer_types is not None and self.layer_types[layer] == "sliding_attention"
        mode = getattr(self.variant, "block_attention", None)
        if mode is None:  # depth_causal, autoregressive: causal by kind
            causal = self.variant.behaviour.block_causal
        else:
            causal = mode == "causal" or (mode == "causal_in_sliding_layers" and sliding)
        per_anchor = sliding and self.window_rule == "per_anchor"
        return LayerAttention(self.sliding_window if sliding else None, causal, per_anchor)

    @property
    def block_causal(self) -> bool:
        """Every layer causal inside the block: then a block of any length <= block_size drafts exactly the
        prefix of the full block (cuttable); otherwise the drafter must run the whole block it was trained on."""
        return all(self.layer_attention(i).block_causal for i in range(self.num_hidden_layers))

    @property
    def has_windows(self) -> bool:
        return self.sliding_window is not None

    @property
    def scored_vocab_size(self) -> int:
        """Width of the drafter's logits: the draft vocabulary if reduced, else the target's."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def feature_size(self) -> int:
        """Width of the concatenated target features the drafter's `fc` consumes."""
        return len(self.target_layer_ids) * self.target.hidden_size

    def engine_fields(self, variant_keys: bool = True) -> dict[str, Any]:
        """HF/DFlash-style keys written beside ours so vLLM, SGLang, TensorRT-LLM and llama.cpp's converter read the
        same config.json (AutoConfig needs model_type; the engines' DFlash loaders read architectures and
        dflash_config), with the variant's own (engine_keys; `variant_keys` False: as written before they were)."""
        fields = self._dflash_fields()
        if not variant_keys:
            return fields
        extra = self.variant.engine_keys()
        return {**fields, **extra, "dflash_config": {**fields["dflash_config"], **extra.get("dflash_config", {})}}

    def _dflash_fields(self) -> dict[str, Any]:
        return {
            "architectures": [self.variant.engine_architecture],
            "model_type": "qwen3",
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
            "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
            "rope_parameters": self.rope_parameters(),
            # all layers causal / none / per layer from layer_types (null: how z-lab and vLLM then resolve it)
            "is_causal": self._engine_is_causal(),
            "use_sliding_window": self.has_windows,  # transformers' Qwen3Config drops sliding_window without it
            "num_target_layers": self.target.num_hidden_layers,
            "target_hidden_size": self.target.hidden_size,  # vLLM sizes fc's input from it (default: hidden_size)
            "dflash_config": {
                "block_size": self.block_size,
                "target_layer_ids": list(self.target_layer_ids),
                "mask_token_id": self.mask_token_id,
                "num_target_layers": self.target.num_hidden_layers,
            },
        }

    def rope_parameters(self) -> dict[str, Any]:
        """transformers' `rope_parameters` (what Qwen3Config, vLLM's get_rope and SGLang read)."""
        scaling = self.rope_scaling.model_dump(exclude_none=True) if self.rope_scaling else {"rope_type": "default"}
        return {**scaling, "rope_theta": self.rope_theta}

    def _engine_is_causal(self) -> bool | None:
        causal = {self.layer_attention(i).block_causal for i in range(self.num_hidden_layers)}
        return causal.pop() if len(causal) == 1 else None

    def engine_layer_types(self) -> list[str]:
        return list(self.layer_types or ["full_attention"] * self.num_hidden_layers)

    def to_json_dict(self) -> dict[str, Any]:
        """What config.json holds: our fields, then the derived engine keys (layer_types always written: engines
        read it)."""
        ours = self.model_dump(mode="json", exclude_none=True)
        if ours["window_rule"] == "per_slot":  # the default, left out so existing checkpoints keep one config
            del ours["window_rule"]
        return {
            **ours,
            "layer_types": self.engine_layer_types(),
            **self.engine_fields(),
        }

    @property
    def drafts_from_anchor(self) -> bool:
        """The anchor's slot drafts: slot j predicts the token j + 1 places after the anchor (the autoregressive
        kind, and a dspark with sample_from_anchor); otherwise slot j predicts the token j places after it."""
        return drafts_from_anchor(self.variant)

    @property
    def max_draft_tokens(self) -> int:
        """Drafts one block proposes (max_draft_tokens(variant, block_size))."""
        return max_draft_tokens(self.variant, self.block_size)

    @property
    def label_span(self) -> int:
        """Tokens from the anchor on that one teacher-forced block reads (the anchor and every draft's label):
        what a training sequence must hold after each anchor."""
        return self.max_draft_tokens + 1

    def check_num_draft_tokens(self, num_draft_tokens: int) -> None:
        """A block proposes at most max_draft_tokens; more would run the drafter off its training."""
        if not 1 <= num_draft_tokens <= self.max_draft_tokens:
            raise SpecError(
                f"num_draft_tokens={num_draft_tokens} does not fit block_size={self.block_size}: "
                f"use 1..{self.max_draft_tokens}, or train a drafter with a larger block_size"
            )


def _explain(item: dict) -> str | None:
    """The valid options where pydantic's own message does not list them."""
    if item["type"] == "extra_forbidden":
        return f"unknown field; valid fields: {', '.join(DrafterConfig.model_fields)}"
    if item["type"] == "union_tag_invalid":
        return f"unknown variant; valid options: {', '.join(VARIANT_KINDS)}"
    return None


def _format_validation_error(error: ValidationError, source: str) -> str:
    return f"{source}: invalid drafter config: " + validation_line(error, _explain)


def is_drafter_config(data: object) -> bool:
    """A config.json object written by portable-spec for a drafter (any version): what targets and engines check
    before treating a directory as something else."""
    return isinstance(data, dict) and "format_version" in data and "variant" in data


ENGINE_KEYS = (
    "architectures",
    "model_type",
    "hidden_act",
    "attention_bias",
    "tie_word_embeddings",
    "max_position_embeddings",
    "rope_parameters",
    "is_causal",
    "use_sliding_window",
    "num_target_layers",
    "target_hidden_size",
    "dflash_config",
)


# top-level engine keys some variants write (their engine_keys): derived like ENGINE_KEYS
VARIANT_ENGINE_KEYS = tuple(
    dict.fromkeys(key for cls in VARIANT_CLASSES for key in cls().engine_keys() if key not in ENGINE_KEYS)
)


def parse_config(data: dict, source: str = "config") -> DrafterConfig:
    """Validate a config dict; raise SpecError listing every bad field with its fix.

    Engine keys (ENGINE_KEYS, a variant's engine_keys) are derived, not free: if present they must agree with our
    fields (a checkpoint written before its variant's engine keys existed agrees with the fields without them)."""
    ours = {key: value for key, value in data.items() if key not in (*ENGINE_KEYS, *VARIANT_ENGINE_KEYS)}
    try:
        config = DrafterConfig.model_validate(ours)
    except ValidationError as error:
        raise SpecError(_format_validation_error(error, source)) from None
    derived, earlier = config.engine_fields(), config.engine_fields(variant_keys=False)
    for key in (*ENGINE_KEYS, *VARIANT_ENGINE_KEYS):
        if key not in data:
            continue
        if key not in derived:
            raise SpecError(
                f"{source}: {key} = {data[key]!r} means nothing for variant {config.kind}; rewrite config.json with "
                "portable-spec, never the engine keys by hand"
            )
        if data[key] != derived[key] and data[key] != earlier.get(key):
            raise SpecError(
                f"{source}: {key} = {data[key]!r} contradicts the drafter fields (expected {derived[key]!r}); "
                "edit the portable fields (variant, block_size, target_layer_ids, ...) and rewrite config.json "
                "with portable-spec, never the engine keys by hand"
            )
    return config


def read_json_object(file: Path, fix: str) -> dict:
    """A config.json's top-level object, or one SpecError naming the file (`fix` says what to do about bad JSON)."""
    try:
        data = json.loads(Path(file).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SpecError(f"{file}: not valid JSON ({error}); {fix}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{file}: top level must be a JSON object, got {type(data).__name__}")
    return data


def read_config(path: Path) -> DrafterConfig:
    """Read and validate `config.json` from a checkpoint directory (or a direct file path)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "not found"
        raise SpecError(f"{file}: {what}; a drafter checkpoint is a directory with config.json + model.safetensors")
    return parse_config(read_json_object(file, "rewrite it with `portable-spec` tools"), str(file))
