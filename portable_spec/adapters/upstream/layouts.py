"""The DFlash checkpoint layouts other toolchains write, read into portable drafter fields.

Two layouts, from their public source:
- dflash: z-lab/dflash's and SpecForge's `DFlashDraftModel` (a transformers Qwen3 model; `zlab` and `specforge` are
  aliases): Qwen3 config keys, `block_size`, `target_layer_ids` and `mask_token_id` in `dflash_config` or at the top
  (dflash_config first, as z-lab's `_draft_value`); `target_layer_ids` i means HF `output_hidden_states[i + 1]`
  (dflash/model.py `extract_context_feature`, offset 1): our convention, taken as is.
- speculators: vLLM's speculators library (`speculators_model_type: dflash`): the layer config nested in
  `transformer_layer_config`, `aux_hidden_state_layer_ids` counted one higher (vLLM's speculators loader maps
  `target_layer_ids = [i - 1 for i in aux_hidden_state_layer_ids]`), a reduced draft vocabulary as `d2t`/`t2d`
  plus its own `lm_head`; `speculators_model_type` dflash2 and dspark (its Markov and confidence heads, read as the
  `dspark` kind, SPECULATORS_DSPARK) too.

Both hold the same weights under the same names (`fc`, `hidden_norm`, `layers.*`, `norm`); the embedding and head
tensors some of them ship (`embed_tokens`, `lm_head`, `t2d`, speculators' frozen `verifier_*` copies) are set aside
for the importer to compare with the target's (a drafter whose `hidden_size` differs from its `target_hidden_size`
ships its own). Sliding-window layers, causal blocks and YaRN are read as the code that trained the checkpoint
computes them (`sliding_layers`, `block_attention`, `rope_scaling`, TRAINER_RULES; checked against the packages'
own forward by the `upstream/*` conformance rows); z-lab's DFlash2 (`DFlash2DraftModel`: convolutions around each
sublayer, a candidate selector) is read as the `dflash2` kind; whatever has no portable equivalent (logit scales,
fused-layer variants, pickled files) is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from portable_spec.core.checkpoint import check_weight_values
from portable_spec.core.spec import (
    LAYER_TYPES,
    SpecError,
    is_drafter_config,
    layer_attention_problem,
    read_json_object,
)

LAYOUTS = ("dflash", "speculators")
LAYOUT_ALIASES = {"zlab": "dflash", "specforge": "dflash"}  # one layout: both write a DFlashDraftModel's Qwen3 config
TARGET_SIDE = ("embed_tokens.weight", "lm_head.weight", "t2d", "verifier_norm.weight", "verifier_lm_head.weight")
PICKLES = ("pytorch_model.bin", "mask_embedding.pt", "model.pt", "training_args.bin")

# Switches the upstream drafters read and what each must be for the drafter to be plain DFlash (our `parallel`).
# A key missing, or holding one of these values, is fine; any other value has no portable equivalent.
NEUTRAL = {
    "input_embedding_scale": (1, 1.0),
    "output_multiplier": (1, 1.0),
    "logit_scale": (1, 1.0),
    "final_logit_softcapping": (None, 0, 0.0),
    "attention_value_scale": (None, 1, 1.0),
    "sample_from_anchor": (False,),
    "use_swa": (False,),
    "projector_type": (None, "dflash"),
    "fusion_mode": (None,),
    "heterogeneous_kv": (False,),
    "add_swa_attention_sink_bias": (False,),
    "use_aux_hidden_state": (True,),
    "shift_label": (None, False),
    "attention_mode": ("gqa", "mha"),
    "attention_modes": (None,),
    "conv_kernel_size": (None,),
    "conv_group_size": (None,),
    "selector_rank": (None,),
    "selector_top_k": (None,),
    "is_neox_style": (None, True),  # rotary as the halves of each head (Qwen3's); the interleaved form is not run
}
DFLASH_CONFIG_KEYS = {
    "target_layer_ids", "mask_token_id", "block_size", "num_target_layers", "target_hidden_size", "causal",
}  # fmt: skip
# DFlash2's own switches (z-lab dflash 0.1.0 DFlash2DraftModel and CandidateSelector read each with _draft_value, no
# default): the dflash2 variant's fields of the same names
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# Domino's own switches (SpecForge 0.2.0 DominoDraftModel._init_draft_head reads them from dflash_config: emb_dim and
# gru_hidden_dim with no default, pure_draft_prefix_len default 0; shift_label must stay false: NEUTRAL)
DOMINO_KEYS = ("emb_dim", "gru_hidden_dim", "pure_draft_prefix_len")
# DSpark's own switches (speculators 0.9.0 DSparkSpeculatorConfig) with its defaults, under their speculators names;
# `enable_confidence_head` is the dspark variant's `confidence_head`, the rest keep their names
SPECULATORS_DSPARK = {
    "sample_from_anchor": True,
    "markov_rank": 256,
    "markov_head_type": "vanilla",
    "enable_confidence_head": True,
    "confidence_head_with_markov": True,
}
DSPARK_FIELDS = {"enable_confidence_head": "confidence_head"}
# z-lab's DFlash2 checkpoints save the selector's codebooks without `.weight` (its from_pretrained key_mapping adds
# it for nn.Embedding); its save_pretrained writes it: both are read under the unsuffixed name, speculators' own
SELECTOR_CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")

# transformers' Qwen3Config defaults, which decide a config's sliding layers when it leaves these keys out
QWEN3_SLIDING_WINDOW, QWEN3_MAX_WINDOW_LAYERS = 4096, 28


@dataclass(frozen=True)
class UpstreamDrafter:
    """An upstream checkpoint read and checked on its own (no target loaded yet)."""

    layout: str
    fields: dict  # portable DrafterConfig fields, all but `variant` and `target`
    weights: dict[str, torch.Tensor]  # drafter-owned, under portable names (d2t kept for a draft vocabulary)
    target_side: dict[str, torch.Tensor]  # embedding/head tensors shipped: the target's, or the drafter's own
    num_target_layers: int | None  # what the checkpoint says its target has, if it says
    verifier: str | None = None  # the target the checkpoint names, if any
    target_hidden_size: int | None = None  # the target width the checkpoint says fc reads, if it says
    block_attention: str = "bidirectional"  # the block attention of the kinds that choose it (spec.ParallelVariant)
    rules: tuple[str, ...] = ()  # how the windows and block attention were read, and from which upstream code
    variant: dict | None = None  # the portable variant's kind and own fields; None: parallel


def _refuse(source: str, key: str, value, fix: str) -> SpecError:
    return SpecError(f"{source}: {key} = {json.dumps(value)} {fix}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _listed(test):
    return lambda value: isinstance(value, list) and all(test(item) for item in value)


# The JSON type of every config key the reader uses, wherever it sits (top level, dflash_config,
# transformer_layer_config, speculators_config): a wrongly typed one is refused by name before it is used.
KEY_TYPES = {
    **dict.fromkeys(
        (
            "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
            "block_size", "mask_token_id", "num_target_layers", "target_hidden_size", "draft_vocab_size",
        ),
        (_whole, "a whole number"),
    ),
    **dict.fromkeys(
        ("num_key_value_heads", "head_dim", "sliding_window", "max_window_layers"), (_whole, "a whole number")
    ),
    **dict.fromkeys(
        ("use_sliding_window", "is_causal", "causal", "sliding_window_non_causal"),
        (lambda v: isinstance(v, bool), "true or false"),
    ),
    **dict.fromkeys(("rope_theta", "rms_norm_eps"), (_number, "a number")),
    **dict.fromkeys(
        ("dflash_config", "transformer_layer_config", "speculators_config", "rope_parameters", "rope_scaling"),
        (lambda v: isinstance(v, dict), "an object"),
    ),
    "verifier": (lambda v: isinstance(v, dict), "an object"),
    "name_or_path": (lambda v: isinstance(v, str), "a string"),
    **dict.fromkeys(("architectures", "layer_types"), (_listed(lambda v: isinstance(v, str)), "a list of strings")),
    **dict.fromkeys(("target_layer_ids", "aux_hidden_state_layer_ids"), (_listed(_whole), "a list of layer ids")),
    **dict.fromkeys(("model_type", "hidden_act", "speculators_model_type"), (lambda v: isinstance(v, str), "a string")),
}  # fmt: skip


def _check_types(values: dict, source: str, prefix: str = "") -> None:
    for key, value in values.items():
        test, kind = KEY_TYPES.get(key, (None, ""))
        if test is not None and value is not None and not test(value):  # null: not set (defaults, or _required)
            raise _refuse(source, prefix + key, value, f"must be {kind}: the file is not a valid DFlash config")
        if isinstance(value, dict):
            _check_types(value, source, f"{prefix}{key}.")


def _check_neutral(values: dict, source: str, prefix: str = "", read: tuple[str, ...] = ()) -> None:
    """Every NEUTRAL switch at a value plain DFlash computes, but those the caller reads itself (`read`)."""
    for key, allowed in NEUTRAL.items():
        if key in values and key not in read and values[key] not in allowed:
            raise _refuse(
                source,
                prefix + key,
                values[key],
                f"has no portable equivalent (portable drafters are plain DFlash here: {key} must be one of "
                f"{', '.join(map(json.dumps, allowed))}); this checkpoint cannot be imported",
            )


def _required(values: dict, key: str, source: str, where: str = ""):
    if values.get(key) is None:
        raise SpecError(f"{source}: {where}{key} is missing; an upstream DFlash checkpoint must set it")
    return values[key]


def layer_fields(values: dict, source: str, prefix: str = "", read: tuple[str, ...] = ()) -> dict:
    """The drafter's layer shapes from a Qwen3-style config dict (z-lab/SpecForge top level, speculators'
    transformer_layer_config), refusing what the portable drafter's Qwen3 layers cannot run (but the switches the
    caller reads itself, `read`)."""
    model_type = values.get("model_type", "qwen3")
    if model_type != "qwen3":
        raise _refuse(source, prefix + "model_type", model_type, "is not qwen3: DFlash drafters are Qwen3 layers")
    if values.get("hidden_act", "silu") != "silu":
        raise _refuse(source, prefix + "hidden_act", values["hidden_act"], "is not silu (the drafter's SwiGLU MLP)")
    if values.get("attention_bias"):
        raise _refuse(source, prefix + "attention_bias", True, "is not supported (portable layers have no biases)")
    _check_neutral(values, source, prefix, read)
    rope = values.get("rope_parameters") or {}
    rope_theta = next((v for v in (values.get("rope_theta"), rope.get("rope_theta")) if v is not None), 10000.0)
    hidden = _required(values, "hidden_size", source, prefix)
    heads = _required(values, "num_attention_heads", source, prefix)
    num_layers = _required(values, "num_hidden_layers", source, prefix)
    return {
        "num_hidden_layers": num_layers,
        **rope_scaling(values, source, prefix),
        **sliding_layers(values, num_layers, source, prefix),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": values.get("num_key_value_heads") or heads,
        "head_dim": values.get("head_dim") or hidden // heads,
        "intermediate_size": _required(values, "intermediate_size", source, prefix),
        "rms_norm_eps": values.get("rms_norm_eps", 1e-6),
        "rope_theta": float(rope_theta),
        "vocab_size": _required(values, "vocab_size", source, prefix),
    }


YARN_KEYS = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor"}
YARN_NEUTRAL = {
    "rope_type": None,
    "type": None,
    "rope_theta": None,
    "truncate": (True,),
    "partial_rotary_factor": (1, 1.0),
}


def rope_scaling(values: dict, source: str, prefix: str = "") -> dict:
    """A YaRN `rope_scaling` field from transformers' `rope_parameters` (or the legacy `rope_scaling` key), as
    `_compute_yarn_parameters` reads it (a missing factor is max_position_embeddings / the original length); plain
    rotary gives no field; any other rotary type, or YaRN keys the portable drafter does not compute (mscale,
    mscale_all_dim, an untruncated range, partial rotary), is refused by name."""
    where, rope = "rope_parameters", values.get("rope_parameters") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    legacy = values.get("rope_scaling") or {}
    if kind == "default" and legacy:
        where, rope = "rope_scaling", legacy
        kind = rope.get("rope_type", rope.get("type", "default"))
    elif legacy and legacy.get("rope_type", legacy.get("type", "default")) != "default":
        both = {key: (rope.get(key), legacy.get(key)) for key in YARN_KEYS | {"rope_type"} if key in legacy}
        differ = {key: pair for key, pair in both.items() if pair[0] != pair[1]}
        if differ:  # transformers would take rope_parameters; the engines may read either
            key, (new, old) = next(iter(sorted(differ.items())))
            raise _refuse(
                source, f"{prefix}rope_scaling.{key}", old, f"disagrees with rope_parameters.{key}={new!r}: keep one"
            )
    if kind == "default":
        return {}
    if kind != "yarn":
        raise _refuse(source, f"{prefix}{where}.rope_type", kind, "is not plain or YaRN rotary: no portable equivalent")
    for key, value in rope.items():
        allowed = YARN_NEUTRAL.get(key, ())
        if key not in YARN_KEYS and allowed is not None and value not in allowed:
            raise _refuse(
                source, f"{prefix}{where}.{key}", value, "is a YaRN option the portable drafter does not compute"
            )
    original = rope.get("original_max_position_embeddings")
    if not _whole(original) or original < 1:
        raise _refuse(
            source, f"{prefix}{where}.original_max_position_embeddings", original, "must be a whole number >= 1"
        )
    for key in ("factor", "beta_fast", "beta_slow", "attention_factor"):
        value = rope.get(key)
        if value is not None and not _number(value):
            raise _refuse(source, f"{prefix}{where}.{key}", value, "must be a number (not a string or boolean)")
    factor = rope.get("factor")
    if factor is None:  # transformers: the extension over the original length
        factor = _required(values, "max_position_embeddings", source, prefix) / original
    if not factor >= 1:
        raise _refuse(
            source,
            f"{prefix}{where}.factor",
            factor,
            "must be >= 1: YaRN extends the original context, never shrinks it",
        )
    scaling = {key: rope[key] for key in ("beta_fast", "beta_slow", "attention_factor") if rope.get(key) is not None}
    return {
        "rope_scaling": {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original, **scaling}
    }


def sliding_layers(values: dict, num_layers: int, source: str, prefix: str = "") -> dict:
    """`layer_types` and `sliding_window` as transformers' Qwen3Config resolves them, which is what z-lab's model.py,
    vLLM and SGLang then read: the window only with `use_sliding_window` (else None), missing layer_types derived as
    sliding from layer `max_window_layers` on. Sliding layers without a window are refused: vLLM and SGLang refuse
    them and z-lab's code would run them unwindowed."""
    use_window = values.get("use_sliding_window", False)
    window = values.get("sliding_window", QWEN3_SLIDING_WINDOW) if use_window else None
    layer_types = values.get("layer_types")
    if layer_types is None:
        first = values.get("max_window_layers", QWEN3_MAX_WINDOW_LAYERS)
        layer_types = [
            "sliding_attention" if window is not None and i >= first else "full_attention" for i in range(num_layers)
        ]
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise _refuse(source, prefix + "layer_types", layer_types, f"has {unknown[0]} layers: no portable equivalent")
    if "sliding_attention" not in layer_types:
        return {}
    if window is None:
        raise _refuse(
            source,
            prefix + "use_sliding_window",
            use_window,
            "with sliding_attention layers: transformers then drops sliding_window, so the layers have no window "
            "(vLLM and SGLang refuse such a config); set use_sliding_window true and sliding_window",
        )
    return {"layer_types": layer_types, "sliding_window": window}


def block_attention(layer_types: list[str] | None, causal: bool | None) -> str:
    """The parallel kind's block attention from an explicit causality (`is_causal`, `dflash_config.causal`,
    speculators' `not sliding_window_non_causal`) or, when none is set, the trainers' default: causal exactly in the
    sliding layers (z-lab `dflash` 0.1.0 dflash/model.py `Qwen3DFlashAttention.is_causal`; SpecForge 0.2.0
    `create_dflash_sdpa_mask`; speculators 0.9.0 `create_anchor_block_mask_mod`; vLLM 0.32 reads the same from
    qwen3_dflash.py `_dflash_layer_causal`). Upstream code that runs it otherwise (SpecForge 0.2.0's spec_generate,
    z-lab's repository at 44947fb: bidirectional) is chosen with `portable-spec import --block-attention`."""
    sliding = [kind == "sliding_attention" for kind in layer_types or []]
    if causal is not None:
        return "causal" if causal else "bidirectional"
    if sliding and all(sliding):
        return "causal"
    return "causal_in_sliding_layers" if any(sliding) else "bidirectional"


def _specforge_domino(dflash: dict, source: str) -> dict:
    """A SpecForge Domino's dflash_config switches as the domino variant's fields, each read as its
    DominoDraftModel reads it (emb_dim and gru_hidden_dim required, pure_draft_prefix_len default 0)."""
    if dflash.get("projector_type", "domino") != "domino":
        raise _refuse(source, "dflash_config.projector_type", dflash["projector_type"], "is not domino")
    variant = {"kind": "domino"}
    for key in DOMINO_KEYS:
        value = dflash.get(key, 0 if key == "pure_draft_prefix_len" else None)
        if not _whole(value) or value < 0:
            raise _refuse(
                source,
                f"dflash_config.{key}",
                value,
                "must be a whole number: SpecForge's DominoDraftModel reads it"
                + (" with no default" if key != "pure_draft_prefix_len" else ""),
            )
        variant[key] = value
    return variant


def _hf_dflash(data: dict, source: str) -> tuple[dict, dict, dict | None]:
    """z-lab / SpecForge: (fields, what it says of its target: num_target_layers, target_hidden_size, the dflash2
    variant's fields or None). Each DFlash key is read as z-lab's model.py `_draft_value` does: `dflash_config`
    first, then the top level."""
    architectures = data.get("architectures") or []
    dflash2 = any(name.startswith("DFlash2") for name in architectures)
    if dflash2 and architectures != ["DFlash2DraftModel"]:
        raise _refuse(source, "architectures", architectures, "is not z-lab's DFlash2DraftModel: no portable kind")
    dflash = data.get("dflash_config") or {}  # an object when set (_check_types)
    domino = architectures == ["DominoDraftModel"] or dflash.get("projector_type") == "domino"
    read = DFLASH2_KEYS if dflash2 else ("projector_type",) if domino else ()
    known = DFLASH_CONFIG_KEYS | set(NEUTRAL) | (set(DOMINO_KEYS) if domino else set())
    unknown = sorted(set(dflash) - known)
    if unknown:
        raise _refuse(
            source,
            f"dflash_config.{unknown[0]}",
            dflash[unknown[0]],
            f"is not a DFlash switch portable-spec knows ({', '.join(sorted(known))}); "
            "this checkpoint cannot be imported",
        )
    _check_neutral(dflash, source, "dflash_config.", read)
    fields = layer_fields(data, source, read=read)
    variant = None
    if dflash2:
        variant = {"kind": "dflash2"}
        for key in DFLASH2_KEYS:
            value = dflash.get(key, data.get(key))
            if not _whole(value):
                raise _refuse(
                    source,
                    f"dflash_config.{key}",
                    value,
                    "must be a whole number: z-lab's DFlash2DraftModel reads it with no default",
                )
            variant[key] = value
    if domino:
        variant = _specforge_domino(dflash, source)
    layer_ids = dflash.get("target_layer_ids", data.get("target_layer_ids"))
    if layer_ids is None:
        raise SpecError(f"{source}: dflash_config.target_layer_ids is missing; an upstream DFlash checkpoint sets it")
    block_size = dflash.get("block_size", data.get("block_size"))
    if block_size is None:
        raise SpecError(f"{source}: block_size is missing (neither at the top level nor in dflash_config)")
    mask_token_id = dflash.get("mask_token_id", data.get("mask_token_id"))
    if mask_token_id is None:
        raise SpecError(f"{source}: dflash_config.mask_token_id is missing; an upstream DFlash checkpoint sets it")
    fields.update(block_size=block_size, target_layer_ids=layer_ids, mask_token_id=mask_token_id)
    causal = data.get("is_causal")
    fields["block_attention"] = block_attention(
        fields.get("layer_types"), causal if causal is not None else dflash.get("causal")
    )
    target = {key: dflash.get(key, data.get(key)) for key in ("num_target_layers", "target_hidden_size")}
    return fields, target, variant


# speculators 0.9.0 DFlash2SpeculatorConfig's defaults for the keys a saved config may leave out
SPECULATORS_DFLASH2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16}


def _speculators_dspark(data: dict, source: str) -> dict:
    """A speculators DSpark config's Markov and confidence switches as the dspark variant's fields (its defaults
    where left out), each checked as DSparkSpeculatorConfig and DSparkDraftModel check it."""
    variant = {"kind": "dspark"}
    for key, default in SPECULATORS_DSPARK.items():
        value = data.get(key, default)
        if key == "markov_rank":
            if not _whole(value) or value < 0:
                raise _refuse(source, key, value, "must be a whole number >= 0 (speculators' DSparkSpeculatorConfig)")
            if value == 0:
                raise _refuse(
                    source,
                    key,
                    value,
                    "turns DSpark's Markov head off (its DFlash backbone alone, drafting from the anchor's slot): no "
                    "portable kind computes that; import a DSpark with its Markov head, or a DFlash checkpoint",
                )
        elif key == "markov_head_type":
            if value not in ("vanilla", "gated", "rnn"):
                raise _refuse(source, key, value, "is not one of vanilla, gated, rnn (speculators' MarkovHead)")
        elif not isinstance(value, bool):
            raise _refuse(source, key, value, "must be true or false (speculators' DSparkSpeculatorConfig)")
        variant[DSPARK_FIELDS.get(key, key)] = value
    return variant


def _speculators(data: dict, source: str) -> tuple[dict, str | None, dict | None]:
    """vLLM speculators: (fields, verifier name, the dflash2 or dspark variant's fields, or None for dflash)."""
    kind = data.get("speculators_model_type")
    if kind not in ("dflash", "dflash2", "dspark"):
        raise _refuse(source, "speculators_model_type", kind, "is not dflash, dflash2 or dspark: those import")
    dflash2 = kind == "dflash2"
    _check_neutral(
        data, source, read=DFLASH2_KEYS if dflash2 else tuple(SPECULATORS_DSPARK) if kind == "dspark" else ()
    )
    variant = _speculators_dspark(data, source) if kind == "dspark" else None
    if dflash2:
        variant = {"kind": "dflash2"}
        for key, default in SPECULATORS_DFLASH2.items():
            value = data.get(key, default)
            if not _whole(value):
                raise _refuse(source, key, value, "must be a whole number (speculators' DFlash2SpeculatorConfig)")
            variant[key] = value
    layer_config = data.get("transformer_layer_config")
    if not isinstance(layer_config, dict):
        raise SpecError(f"{source}: transformer_layer_config is missing or not an object")
    fields = layer_fields(layer_config, source, "transformer_layer_config.")
    target_hidden = data.get("target_hidden_size")
    if target_hidden not in (None, fields["hidden_size"]):  # its DFlashDraftModel sizes fc from its own width
        raise _refuse(
            source,
            "target_hidden_size",
            target_hidden,
            "differs from hidden_size: speculators' DFlash sizes fc from its own width (models/dflash/core.py)",
        )
    aux_ids = _required(data, "aux_hidden_state_layer_ids", source)
    draft_vocab = data.get("draft_vocab_size")
    fields.update(
        block_size=data.get("block_size", 8),  # speculators' default
        target_layer_ids=[i - 1 for i in aux_ids],  # speculators counts HF hidden_states indices (vLLM #40727)
        mask_token_id=_required(data, "mask_token_id", source),
    )
    if draft_vocab is not None and draft_vocab != fields["vocab_size"]:
        fields["draft_vocab_size"] = draft_vocab
    # speculators trains sliding layers causal unless sliding_window_non_causal (default false; true for dflash2,
    # DFlash2SpeculatorConfig) and full layers bidirectional (models/dflash/attention.py, config.py)
    non_causal = data.get("sliding_window_non_causal", dflash2)
    fields["block_attention"] = block_attention(fields.get("layer_types"), False if non_causal else None)
    if "sliding_window" in fields:
        fields["window_rule"] = "per_anchor"
    verifier = (data.get("speculators_config") or {}).get("verifier") or {}
    return fields, verifier.get("name_or_path"), variant


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index, "re-save the checkpoint").get("weight_map") or {}
        return [path / name for name in sorted(set(weight_map.values()))]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    pickled = [name for name in PICKLES if (path / name).exists()]
    if pickled:
        raise SpecError(
            f"{path}: only pickled weights ({', '.join(pickled)}); pickles are never loaded: re-save the drafter "
            "with safetensors (model.save_pretrained(dir, safe_serialization=True)) and import that"
        )
    raise SpecError(f"{path}: no model.safetensors (or model.safetensors.index.json) beside config.json")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        try:
            weights.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError) as error:
            raise SpecError(f"{file}: not a readable safetensors file ({error})") from None
    if weights and all(name.startswith("model.") for name in weights if name not in ("lm_head.weight", "d2t", "t2d")):
        weights = {name.removeprefix("model."): tensor for name, tensor in weights.items()}
    return weights


def _portable_dtypes(weights: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """Weights in the dtypes a portable checkpoint holds: float64 stored as float32, d2t as int64 (whole offsets
    stored as floats or narrower ints are converted; a fractional one is refused)."""
    out = {name: t.float() if t.dtype == torch.float64 else t for name, t in weights.items()}
    d2t = out.get("d2t")
    if d2t is not None and d2t.dtype != torch.int64:
        if d2t.is_floating_point() and not bool((d2t == d2t.round()).all()):
            raise SpecError(f"{path}: d2t holds non-integer offsets ({d2t.dtype}); it must map draft ids to target ids")
        out["d2t"] = d2t.to(torch.int64)
    return out


def detect_layout(data: dict) -> str | None:
    """Which upstream layout a config.json object is in: dflash (z-lab/SpecForge) or speculators; None if neither."""
    if "speculators_model_type" in data:
        return "speculators"
    architectures = data.get("architectures") or []
    if "dflash_config" in data or any(str(name).startswith("DFlash") for name in architectures):
        return "dflash"
    return None


def read_upstream(path: Path, layout: str = "auto") -> UpstreamDrafter:
    """An upstream DFlash checkpoint directory, read and checked without its target; one SpecError otherwise."""
    path = Path(path)
    layout = LAYOUT_ALIASES.get(layout, layout)
    if layout not in ("auto", *LAYOUTS):
        raise SpecError(
            f"layout={layout!r} is unknown; valid options: auto, {', '.join(LAYOUTS)} ({' and '.join(LAYOUT_ALIASES)} "
            "are dflash)"
        )
    config_file = path / "config.json"
    if not config_file.is_file():
        raise SpecError(f"{config_file}: not found; an upstream DFlash checkpoint is a directory with config.json")
    data = read_json_object(config_file, "it is not a checkpoint config")
    source = str(config_file)
    _check_types(data, source)
    if is_drafter_config(data):
        raise SpecError(f"{path}: already a portable-spec checkpoint; use it as it is (nothing to import)")
    family = detect_layout(data)
    if family is None:
        raise SpecError(
            f"{source}: not a DFlash checkpoint (architectures={data.get('architectures')}, no dflash_config or "
            "speculators_model_type); import reads z-lab/dflash, SpecForge and speculators DFlash drafters"
        )
    verifier, target, variant = None, {}, None
    if family == "speculators":
        fields, verifier, variant = _speculators(data, source)
        found = "speculators"
    else:
        found = "dflash"
        fields, target, variant = _hf_dflash(data, source)
    if layout != "auto" and layout != found:
        raise SpecError(f"{path}: layout={layout} given, but config.json is in the {found} layout; pass --layout auto")
    if (path / "mask_embedding.pt").exists():
        raise SpecError(
            f"{path / 'mask_embedding.pt'}: a separately trained mask embedding, pickled; pickles are never loaded "
            "and portable drafters embed the mask token through the embedding table: this checkpoint cannot be imported"
        )
    weights = _portable_dtypes(_read_weights(path), path)
    for name in SELECTOR_CODEBOOKS:
        if name + ".weight" in weights and name not in weights:
            weights[name] = weights.pop(name + ".weight")
    target_side = {name: weights.pop(name) for name in TARGET_SIDE if name in weights}
    check_weight_values(str(path), weights)
    if "d2t" in weights and "draft_vocab_size" not in fields:
        fields["draft_vocab_size"] = int(weights["d2t"].shape[0])
    if fields.get("draft_vocab_size") is not None and "d2t" not in weights:
        raise SpecError(
            f"{path}: draft_vocab_size={fields['draft_vocab_size']} but no d2t tensor maps draft ids to target ids"
        )
    mode = fields.pop("block_attention")
    rules = trainer_rules(found, fields)
    problem = layer_attention_problem(
        fields.get("layer_types"), fields.get("sliding_window"), fields["num_hidden_layers"], fields["block_size"]
    )
    if problem:  # before the target loads
        raise SpecError(f"{source}: {problem}; this checkpoint cannot be imported")
    return UpstreamDrafter(
        found,
        fields,
        weights,
        target_side,
        target.get("num_target_layers"),
        verifier,
        target.get("target_hidden_size"),
        mode,
        rules,
        variant,
    )


# What each layout's trainer computes in sliding layers, and where upstream code disagrees with it (read from the
# packages' source at these versions): the import's defaults and the notes its printout carries.
TRAINER_RULES = {
    "speculators": (
        "speculators 0.9.0 trains sliding layers with one window per block, kv_pos >= anchor - W for every slot "
        "(models/dflash/attention.py base_prefix_mod), causal inside the block unless sliding_window_non_causal, "
        "full layers bidirectional: imported as window_rule=per_anchor. vLLM and SGLang serve such a drafter with "
        "per-slot windows (q - k < W), a different function (--window-rule per_slot imports that one)"
    ),
    "dflash": (
        "z-lab dflash 0.1.0 (dflash/model.py _attention_mask) and SpecForge 0.2.0's trainer "
        "(create_dflash_sdpa_mask) window each slot, q - k < W, causal in sliding layers unless is_causal says "
        "otherwise: imported as window_rule=per_slot. SpecForge 0.2.0's spec_generate and z-lab's repository at "
        "44947fb run sliding layers bidirectionally (--block-attention bidirectional imports that one)"
    ),
}


def trainer_rules(layout: str, fields: dict) -> tuple[str, ...]:
    """The note an import prints about its sliding layers' rules (none without sliding layers)."""
    return (TRAINER_RULES[layout],) if "sliding_window" in fields else ()
