"""`portable-spec import`: an upstream DFlash checkpoint (layouts.py) bound to a target and written portable.

The checkpoint is read and checked first, without its target; then the target loads and the binding is checked:
vocabulary, width, layer count and layer ids through the portable config's own rules, every weight name and shape,
and the target-side tensors a checkpoint may carry (`embed_tokens`, `lm_head`) against the target's own, since a
portable drafter always embeds and scores with its target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from portable_spec.adapters.upstream.layouts import UpstreamDrafter, read_upstream
from portable_spec.core.checkpoint import save_drafter
from portable_spec.core.drafter import check_draft_vocab, check_weight_shapes, target_ids_of
from portable_spec.core.outputs import check_output_dir
from portable_spec.core.spec import DrafterConfig, SpecError, parse_config
from portable_spec.core.target import TargetModel


@dataclass(frozen=True)
class ImportResult:
    out: Path
    config: DrafterConfig
    layout: str


def _same_matrix(stored: torch.Tensor, own: torch.Tensor) -> bool:
    """Equal up to the rounding of the dtype a checkpoint stored it in (bf16 at worst)."""
    return tuple(stored.shape) == tuple(own.shape) and torch.allclose(
        stored.float(), own.detach().float().cpu(), rtol=1e-2, atol=1e-3
    )


def _check_target_side(upstream: UpstreamDrafter, config: DrafterConfig, target: TargetModel, source: str) -> None:
    """A shipped embedding or LM head must be the target's (rows at the draft ids for a draft vocabulary)."""
    embedding = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    rows = None
    if config.draft_vocab_size is not None:
        rows = target_ids_of(upstream.weights["d2t"])
        check_draft_vocab(rows, config, f"{source}: d2t")
        t2d = upstream.target_side.get("t2d")
        if t2d is not None and sorted(t2d.nonzero()[:, 0].tolist()) != sorted(rows.tolist()):
            raise SpecError(f"{source}: t2d and d2t name different draft vocabularies; the checkpoint is inconsistent")
    checks = {"embed_tokens.weight": embedding, "lm_head.weight": head if rows is None else head[rows.to(head.device)]}
    for name, own in checks.items():
        stored = upstream.target_side.get(name)
        if stored is not None and not _same_matrix(stored, own):
            raise SpecError(
                f"{source}: {name} {tuple(stored.shape)} is not the target's "
                f"{'rows at the draft ids' if name == 'lm_head.weight' and rows is not None else 'matrix'} "
                "(a drafter trained with its own embedding or head); portable drafters embed and score with the "
                "target's own, so this checkpoint cannot be imported for this target"
            )


def import_drafter(
    source: Path, target_dir: Path, out: Path, layout: str = "auto", force: bool = False
) -> ImportResult:
    """Read `source` in an upstream layout, bind it to the target at `target_dir`, write a portable checkpoint to
    `out` (atomically; an existing output is replaced only if it is a drafter, or with `force`)."""
    source, out = Path(source), Path(out)
    upstream = read_upstream(source, layout)
    check_output_dir(out, "drafter", inputs=(source, target_dir), force=force)  # before the target loads
    target = TargetModel.load(target_dir)
    layers = target.config.num_hidden_layers
    if upstream.num_target_layers not in (None, layers):
        raise SpecError(
            f"{source}: num_target_layers = {upstream.num_target_layers}, the target {target.model_id!r} has "
            f"{layers} layers; import it for the target it was trained for"
        )
    config = parse_config(
        {
            "variant": {"kind": "parallel", "block_attention": upstream.block_attention},
            **upstream.fields,
            "target": target.binding(upstream.verifier),
        },
        f"{source} ({upstream.layout} layout)",
    )
    check_weight_shapes(config, {name: tuple(t.shape) for name, t in upstream.weights.items()}, str(source))
    _check_target_side(upstream, config, target, str(source))
    save_drafter(out, config, upstream.weights, force=force)
    target.load_drafter(out)  # the written checkpoint loads and binds, as every backend will load it
    return ImportResult(out, config, upstream.layout)
