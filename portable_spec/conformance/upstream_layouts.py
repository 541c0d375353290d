"""Checkpoints laid out the way z-lab/dflash, SpecForge and vLLM's speculators write a DFlash drafter, for the
`import/*` and `layers/*` checks, which hand trained fixture drafters to engines in those layouts. This is still
portable-spec writing files (from transformers' `Qwen3Config` plus the keys each project's source adds), so it can
share a misreading with the importer; what those projects' own code computes is checked by the `upstream/*` rows
(upstream_oracle/), whose oracle is the packages themselves.

- zlab: z-lab/dflash as its current code reads and its fixtures are written (dflash/model.py `_draft_value`,
  tests/fixtures/dflash2-config.json): Qwen3 keys, `is_causal` at the top, `block_size`, `target_layer_ids` and
  `mask_token_id` in `dflash_config`, `num_target_layers`, sliding layers with `use_sliding_window: true`.
- specforge: SpecForge's DFlash configs (configs/qwen3.5-27b-dflash.json, configs/qwen3-8b-dflash.json): `block_size`
  and `num_target_layers` at the top, `dflash_config {mask_token_id, target_layer_ids}`, `auto_map`,
  `rope_scaling: null`, no `is_causal`.
- speculators: `DFlashSpeculatorConfig` as its trainer saves it (scripts/train.py
  `create_transformer_layer_config`, src/speculators/models/dflash/config.py): `transformer_layer_config` as
  `Qwen3Config.to_diff_dict()` whose layers all slide by default (`--full-attention-indices` makes some full) with
  `use_sliding_window` set when any does, `aux_hidden_state_layer_ids` = HF hidden-state indices
  (target_layer_ids + 1), the config defaults (`sliding_window_non_causal: false`, `projector_type: dflash`),
  `speculators_config` with one greedy proposal of `block_size - 1` tokens and the verifier; the target's
  `embed_tokens` and `lm_head` ship beside the drafter (convert/dflash/converter.py).

z-lab and SpecForge write one layout (transformers' Qwen3 config of a `DFlashDraftModel`); the importer reads both
as `dflash`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from portable_spec.core.spec import read_config

UPSTREAM_LAYOUTS = ("zlab", "specforge", "speculators")
READ_AS = {"zlab": "dflash", "specforge": "dflash", "speculators": "speculators"}  # the importer's layout names
SPECULATORS_WINDOW = 2048  # speculators' scripts/train.py --sliding-window default
# Fields that are Qwen3Config's own arguments, under the same names in DFlashShape and a portable config.
QWEN3_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
)


@dataclass(frozen=True)
class DFlashShape:
    """What an upstream DFlash drafter is made of, in upstream terms."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int
    block_size: int
    target_layer_ids: list[int]  # HF output_hidden_states[i + 1], z-lab's convention
    mask_token_id: int
    num_target_layers: int
    verifier: str
    verifier_architecture: str
    draft_vocab_size: int | None = None  # speculators only: weights then carry d2t, t2d and the draft lm_head
    layer_types: list[str] | None = None  # None: all full_attention
    sliding_window: int | None = None
    is_causal: bool | None = None  # zlab only: written at the top when set
    rope_scaling: dict | None = None  # YaRN parameters of transformers' rope_parameters (rope_type: yarn)
    sliding_window_non_causal: bool = False  # speculators only (its config default)
    target_hidden_size: int | None = None  # dflash layout, when the drafter's width is not its target's (vLLM's key)


def with_draft_head(weights: dict[str, torch.Tensor], target_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """What speculators saves beside a reduced-vocabulary drafter's layers: `t2d` (bool over the target vocabulary)
    and its own `lm_head` (the target head's rows at the draft ids, target id = draft id + d2t)."""
    rows = torch.arange(len(weights["d2t"])) + weights["d2t"].to(torch.int64)
    t2d = torch.zeros(target_head.shape[0], dtype=torch.bool)
    t2d[rows] = True
    return {**weights, "t2d": t2d, "lm_head.weight": target_head[rows].detach().clone()}


def _qwen3_config(shape: DFlashShape):
    from transformers import Qwen3Config

    layer_types = shape.layer_types or ["full_attention"] * shape.num_hidden_layers
    return Qwen3Config(
        **{name: getattr(shape, name) for name in QWEN3_FIELDS},
        rope_parameters={**(shape.rope_scaling or {"rope_type": "default"}), "rope_theta": shape.rope_theta},
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        layer_types=layer_types,
        sliding_window=shape.sliding_window,
        use_sliding_window="sliding_attention" in layer_types,  # as speculators' scripts/train.py sets it
    )


def write_upstream(layout: str, out: Path, shape: DFlashShape, weights: dict[str, torch.Tensor]) -> Path:
    """`out` holding config.json + model.safetensors as `layout`'s project writes them (weights: DFlash names)."""
    out = Path(out)
    if shape.draft_vocab_size is not None and layout != "speculators":
        raise ValueError(f"{layout} has no draft vocabulary (its drafters score the target's whole head)")
    out.mkdir(parents=True, exist_ok=True)
    config = _qwen3_config(shape)
    if layout in ("zlab", "specforge"):
        config.architectures = ["DFlashDraftModel"]
        config.num_target_layers = shape.num_target_layers
        dflash = {"target_layer_ids": list(shape.target_layer_ids), "mask_token_id": shape.mask_token_id}
        if shape.target_hidden_size is not None:
            config.target_hidden_size = shape.target_hidden_size
        if layout == "zlab":
            dflash["block_size"] = shape.block_size
            if shape.is_causal is not None:
                config.is_causal = shape.is_causal
        else:
            if shape.is_causal is not None:
                raise ValueError("specforge configs carry no is_causal: write this drafter in the zlab layout")
            config.block_size = shape.block_size
            config.auto_map = {"AutoModel": "dflash.DFlashDraftModel"}
        config.dflash_config = dflash
        config.save_pretrained(out)
        if layout == "specforge":  # its configs carry the legacy key (transformers warns when it is set)
            data = json.loads((out / "config.json").read_text())
            (out / "config.json").write_text(json.dumps({**data, "rope_scaling": None}, indent=2) + "\n")
    elif layout == "speculators":
        data = {
            "architectures": ["DFlashSpeculator"],
            "speculators_model_type": "dflash",
            "speculators_version": "0.3.0",
            "transformer_layer_config": config.to_diff_dict(),
            "draft_vocab_size": shape.draft_vocab_size or shape.vocab_size,
            "block_size": shape.block_size,
            "target_hidden_size": shape.target_hidden_size,
            "aux_hidden_state_layer_ids": [i + 1 for i in shape.target_layer_ids],
            "mask_token_id": shape.mask_token_id,
            "sliding_window_non_causal": shape.sliding_window_non_causal,
            "projector_type": "dflash",
            "speculators_config": {
                "algorithm": "dflash",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": shape.block_size - 1}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": shape.verifier, "architectures": [shape.verifier_architecture]},
            },
        }
        (out / "config.json").write_text(json.dumps(data, indent=2) + "\n")
    else:
        raise ValueError(f"layout {layout!r}: one of {UPSTREAM_LAYOUTS}")
    save_file({name: t.contiguous() for name, t in weights.items()}, str(out / "model.safetensors"), {"format": "pt"})
    return out


def _block_causality(config) -> dict:
    """The upstream keys that say a portable parallel drafter's block attention: z-lab's `is_causal` (left out where
    the upstream default already reads right) and speculators' `sliding_window_non_causal` (true only for a
    bidirectional drafter with sliding layers; its default, false, otherwise)."""
    mode = config.variant.block_attention
    sliding = config.layer_types is not None
    is_causal = {"causal": True, "bidirectional": False if sliding else None}.get(mode)
    return {"is_causal": is_causal, "sliding_window_non_causal": sliding and mode == "bidirectional"}


def shape_of_portable(config, **upstream) -> DFlashShape:
    """The upstream description of a portable parallel drafter (to lay the shipped fixture out upstream): its layers,
    window, rotary and block attention as upstream keys; `upstream` overrides any DFlashShape field."""
    fields = {"layer_types": config.layer_types, "sliding_window": config.sliding_window, **_block_causality(config)}
    return DFlashShape(
        **{name: getattr(config, name) for name in QWEN3_FIELDS},
        rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling.model_dump(exclude_none=True) if config.rope_scaling else None,
        block_size=config.block_size,
        target_layer_ids=list(config.target_layer_ids),
        mask_token_id=config.mask_token_id,
        num_target_layers=config.target.num_hidden_layers,
        verifier=config.target.model_id,
        verifier_architecture=config.target.architecture,
        draft_vocab_size=config.draft_vocab_size,
        target_hidden_size=config.target.hidden_size if config.hidden_size != config.target.hidden_size else None,
        **{**fields, **upstream},
    )


def with_target_side(weights: dict[str, torch.Tensor], target_dir: Path) -> dict[str, torch.Tensor]:
    """What a speculators checkpoint ships beside the drafter's layers: the verifier's `embed_tokens` and its
    `lm_head` (draft rows + `t2d` for a draft vocabulary), frozen copies the trainer saves (speculators
    src/speculators/model.py `load_verifier_weights`; only `verifier_lm_head`/`verifier_norm` are left out on save)."""
    from portable_spec.core.target import TargetModel

    model = TargetModel.load(target_dir).model
    embed = model.get_input_embeddings().weight.detach().clone()
    head = model.get_output_embeddings().weight.detach().clone()
    shipped = with_draft_head(weights, head) if "d2t" in weights else {**weights, "lm_head.weight": head}
    return {**shipped, "embed_tokens.weight": embed}


def write_portable_as_upstream(
    layout: str, out: Path, drafter_dir: Path, target_dir: Path | None = None, **upstream
) -> Path:
    """A portable parallel drafter checkpoint laid out in `out` as `layout`'s project writes it (`upstream`: as
    shape_of_portable); speculators ships the target's embedding and head, so it needs `target_dir` (a drafter
    with its own ships those instead, in every layout)."""
    config = read_config(drafter_dir)
    shape = shape_of_portable(config, **upstream)
    weights = load_file(str(Path(drafter_dir) / "model.safetensors"))
    if layout == "speculators" and not config.own_embeddings:
        if target_dir is None:
            raise ValueError("a speculators checkpoint ships its target's embed_tokens and lm_head: pass target_dir")
        weights = with_target_side(weights, target_dir)
    return write_upstream(layout, out, shape, weights)
