"""`portable-spec export speculators`: a portable parallel drafter in vLLM speculators' DFlash layout, a dflash2 or a
dspark one in its DFlash2 or DSpark layout (speculators 0.9.0 models/dflash2, models/dspark), for users who keep
that toolchain (vLLM reads it with `speculative_config={"model": OUT}` and no method).

Only `parallel`, `dflash2` and `dspark` are expressible: speculators' DFlash has no shift-mix, so depth_causal (and the
multi-pass autoregressive baseline) is refused with the way to serve it instead. Block causality is one flag there,
`sliding_window_non_causal`, read two ways: speculators' trainer makes sliding layers causal unless it is true and
keeps full layers bidirectional; vLLM 0.32 turns it into the causality of every layer (`dflash_config.causal`). So a
bidirectional drafter is written true, and a causal one only when every layer slides (both readings agree); a
causal block with full layers has no file both read alike and is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from portable_spec.adapters.upstream.layouts import DFLASH2_KEYS, DSPARK_FIELDS, SPECULATORS_DSPARK
from portable_spec.core.checkpoint import load_drafter_files
from portable_spec.core.drafter import target_ids_of
from portable_spec.core.outputs import check_output_dir, write_dir_atomically
from portable_spec.core.spec import MAX_POSITION_EMBEDDINGS, SpecError
from portable_spec.core.target import TargetModel

KIND = "speculators-export"
LAYER_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "rms_norm_eps",
    "vocab_size",
)


# kind -> (architectures, speculators_model_type) as speculators 0.9.0's configs default them
ARCHITECTURES = {
    "parallel": ("DFlashSpeculator", "dflash"),
    "dflash2": ("DFlash2DraftModel", "dflash2"),
    "dspark": ("DSparkSpeculator", "dspark"),
}


def _non_causal(config) -> bool:
    """sliding_window_non_causal for a parallel drafter config, or a SpecError when no value reads as it runs."""
    mode = config.variant.block_attention
    if mode == "bidirectional":
        return True
    if config.layer_types and all(kind == "sliding_attention" for kind in config.layer_types):
        return False
    raise SpecError(
        f"variant.block_attention={mode} with full-attention layers ({config.engine_layer_types()}) cannot be "
        "written in the speculators format: its one flag, sliding_window_non_causal, makes full layers bidirectional "
        "in speculators and causal in vLLM; serve the portable checkpoint instead: "
        'speculative_config={"method": "dflash", "model": DRAFTER}'
    )


def speculators_config(config) -> dict:
    """config.json of the speculators layout for a portable parallel drafter config."""
    if config.hidden_size != config.target.hidden_size:
        raise SpecError(
            f"hidden_size={config.hidden_size} with a {config.target.hidden_size}-wide target cannot be written in "
            "the speculators format: its DFlash sizes fc from the drafter's own width (src/speculators/models/dflash/"
            'core.py); serve the portable checkpoint instead: speculative_config={"method": "dflash", "model": DRAFTER}'
        )
    if config.has_windows and config.window_rule != "per_anchor":
        raise SpecError(
            f"window_rule={config.window_rule} (sliding_window {config.sliding_window}) cannot be written in the "
            "speculators format: speculators 0.9.0's trainer windows every slot of a block from its anchor "
            "(models/dflash/attention.py base_prefix_mod), so the checkpoint would be trained on and imported back "
            "as another function; serve the portable checkpoint instead: "
            'speculative_config={"method": "dflash", "model": DRAFTER}'
        )
    layer = {name: getattr(config, name) for name in LAYER_FIELDS} | {
        "model_type": "qwen3",
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rope_parameters": config.rope_parameters(),
        "layer_types": config.engine_layer_types(),
        **({"use_sliding_window": True, "sliding_window": config.sliding_window} if config.has_windows else {}),
    }
    own, variant = {}, config.variant
    if config.kind == "dflash2":  # speculators 0.9.0 DFlash2SpeculatorConfig: the four keys at the top level
        own = {name: getattr(variant, name) for name in DFLASH2_KEYS}
    elif config.kind == "dspark":  # speculators 0.9.0 DSparkSpeculatorConfig: its five keys at the top level
        own = {name: getattr(variant, DSPARK_FIELDS.get(name, name)) for name in SPECULATORS_DSPARK}
    architecture, model_type = ARCHITECTURES[config.kind]
    return {
        "architectures": [architecture],
        "speculators_model_type": model_type,
        **own,
        "transformer_layer_config": layer,
        "draft_vocab_size": config.scored_vocab_size,
        "block_size": config.block_size,
        "aux_hidden_state_layer_ids": [i + 1 for i in config.target_layer_ids],  # HF hidden_states indices
        "mask_token_id": config.mask_token_id,
        "sliding_window_non_causal": _non_causal(config),
        "projector_type": "dspark" if config.kind == "dspark" else "dflash",
        "speculators_config": {
            "algorithm": model_type,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.max_draft_tokens}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": config.target.model_id, "architectures": [config.target.architecture]},
        },
    }


def export_speculators(drafter_dir: Path, out: Path, target_dir: Path | None = None, force: bool = False) -> Path:
    """Write `out` self-contained, as speculators' converter does (vllm-project/speculators
    src/speculators/convert/dflash/converter.py): the target's `embed_tokens` and `lm_head` (the draft ids' rows for
    a draft vocabulary, with `t2d`), or the drafter's own, ship beside the drafter's layers, so the target is
    needed."""
    drafter_dir, out = Path(drafter_dir), Path(out)
    config, weights = load_drafter_files(drafter_dir)
    if config.kind not in ARCHITECTURES:
        raise SpecError(
            f"{drafter_dir}: variant={config.kind} cannot be expressed in the speculators format (it has DFlash, "
            "DFlash2 and DSpark layouts: no shift-mix, no Domino head); serve it through portable-spec's vLLM plugin "
            f'instead: speculative_config={{"method": "dflash", "model": "{drafter_dir}"}}'
        )
    if target_dir is None:
        raise SpecError(
            f"{drafter_dir}: a speculators checkpoint ships its target's embed_tokens and lm_head (the draft ids' "
            "rows for a draft vocabulary), as speculators' converter writes it: pass --target TARGET"
        )
    speculators_config(config)  # refuses what the layout cannot say, before anything is written or loaded
    check_output_dir(out, KIND, inputs=(drafter_dir, target_dir), force=force)
    target = TargetModel.load(target_dir)
    target.check_drafter(config)
    dtype = weights["fc.weight"].dtype
    rows = None if config.draft_vocab_size is None else target_ids_of(weights["d2t"])
    if rows is not None:
        weights["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool).index_fill_(0, rows, True)
    if not config.own_embeddings:  # a drafter with its own has them in `weights` already
        # copies: a tied target's embedding and head are one tensor, and the file holds both
        weights.update({name: t.to(dtype).clone() for name, t in target.embedding_and_head(rows).items()})

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(speculators_config(config), indent=2) + "\n")
        tensors = {name: tensor.contiguous() for name, tensor in weights.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    return write_dir_atomically(out, write, kind=KIND, force=force)
