"""Checkpoints written the way z-lab/dflash, SpecForge and vLLM's speculators write a DFlash drafter, for the
import checks. Independent of portable-spec's own writers: each config comes from transformers' `Qwen3Config`
(what those projects' draft models are built on) plus the keys each project's source adds, so a mistake in the
importer or the exporter cannot be mirrored here.

- zlab: z-lab/dflash `DFlashDraftModel.save_pretrained`: Qwen3 keys, top-level `block_size`, `num_target_layers`,
  `dflash_config {target_layer_ids, mask_token_id}`, `auto_map`.
- specforge: SpecForge's `DFlashDraftModel`: `block_size` inside `dflash_config`, with `attention_mode: gqa`.
- speculators: `DFlashSpeculatorConfig` as its trainer saves it (`from_training_args`): `transformer_layer_config`
  as `Qwen3Config.to_diff_dict()`, `aux_hidden_state_layer_ids` = HF hidden-state indices (target_layer_ids + 1),
  the trainer's defaults (`sliding_window_non_causal: false`, `projector_type: dflash`), `speculators_config` with
  one greedy proposal of `block_size - 1` tokens and the verifier.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from portable_spec.core.spec import read_config

UPSTREAM_LAYOUTS = ("zlab", "specforge", "speculators")
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


def with_draft_head(weights: dict[str, torch.Tensor], target_head: torch.Tensor) -> dict[str, torch.Tensor]:
    """What speculators saves beside a reduced-vocabulary drafter's layers: `t2d` (bool over the target vocabulary)
    and its own `lm_head` (the target head's rows at the draft ids, target id = draft id + d2t)."""
    rows = torch.arange(len(weights["d2t"])) + weights["d2t"].to(torch.int64)
    t2d = torch.zeros(target_head.shape[0], dtype=torch.bool)
    t2d[rows] = True
    return {**weights, "t2d": t2d, "lm_head.weight": target_head[rows].detach().clone()}


def _qwen3_config(shape: DFlashShape):
    from transformers import Qwen3Config

    return Qwen3Config(
        **{name: getattr(shape, name) for name in QWEN3_FIELDS},
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        max_position_embeddings=32768,
        tie_word_embeddings=False,
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
        dflash = {"target_layer_ids": list(shape.target_layer_ids), "mask_token_id": shape.mask_token_id}
        if layout == "zlab":
            config.block_size = shape.block_size
            config.num_target_layers = shape.num_target_layers
            config.auto_map = {"AutoModel": "dflash.DFlashDraftModel"}
        else:
            dflash.update(block_size=shape.block_size, attention_mode="gqa")
        config.dflash_config = dflash
        config.save_pretrained(out)
    elif layout == "speculators":
        data = {
            "architectures": ["DFlashSpeculator"],
            "speculators_model_type": "dflash",
            "speculators_version": "0.3.0",
            "transformer_layer_config": config.to_diff_dict(),
            "draft_vocab_size": shape.draft_vocab_size or shape.vocab_size,
            "block_size": shape.block_size,
            "target_hidden_size": None,
            "aux_hidden_state_layer_ids": [i + 1 for i in shape.target_layer_ids],
            "mask_token_id": shape.mask_token_id,
            "sliding_window_non_causal": False,
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


def shape_of_portable(config) -> DFlashShape:
    """The upstream description of a portable parallel drafter (to lay the shipped fixture out upstream)."""
    return DFlashShape(
        **{name: getattr(config, name) for name in QWEN3_FIELDS},
        rope_theta=config.rope_theta,
        block_size=config.block_size,
        target_layer_ids=list(config.target_layer_ids),
        mask_token_id=config.mask_token_id,
        num_target_layers=config.target.num_hidden_layers,
        verifier=config.target.model_id,
        verifier_architecture=config.target.architecture,
        draft_vocab_size=config.draft_vocab_size,
    )


def write_portable_as_upstream(layout: str, out: Path, drafter_dir: Path) -> Path:
    """A portable parallel drafter checkpoint (full vocabulary) laid out in `out` as `layout`'s project writes it."""
    shape = shape_of_portable(read_config(drafter_dir))
    return write_upstream(layout, out, shape, load_file(str(Path(drafter_dir) / "model.safetensors")))
