"""`portable-spec import`: an upstream DFlash checkpoint (layouts.py) bound to a target and written portable.

The checkpoint is read and checked first, without its target; then the target loads and the binding is checked:
vocabulary, width, layer count and layer ids through the portable config's own rules, every weight name and shape.
The embedding and head a checkpoint may carry (`embed_tokens`, `lm_head`) are compared with the target's: the
target's own are dropped (the drafter shares them), others become the drafter's own (`own_embeddings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from portable_spec.adapters.upstream.layouts import UpstreamDrafter, read_upstream
from portable_spec.core.checkpoint import check_weight_values, save_drafter
from portable_spec.core.drafter import check_draft_vocab, check_weight_shapes, target_ids_of
from portable_spec.core.outputs import check_output_dir
from portable_spec.core.spec import BLOCK_ATTENTION, WINDOW_RULES, DrafterConfig, SpecError, parse_config
from portable_spec.core.target import TargetModel
from portable_spec.core.target_checks import check_target_dir

TRAINER = "trainer"  # an import option's default: what the code that trained the checkpoint computes
WINDOW_RULE_CHOICES = (TRAINER, *WINDOW_RULES)
BLOCK_ATTENTION_CHOICES = (TRAINER, *BLOCK_ATTENTION)


@dataclass(frozen=True)
class ImportResult:
    out: Path
    config: DrafterConfig
    layout: str
    rules: tuple[str, ...] = ()  # how sliding layers were read (layouts.TRAINER_RULES), for the printout


def check_import_options(window_rule: str, block_attention: str) -> None:
    """--window-rule and --block-attention name a choice, checked before anything is read."""
    for flag, value, choices in (
        ("--window-rule", window_rule, WINDOW_RULE_CHOICES),
        ("--block-attention", block_attention, BLOCK_ATTENTION_CHOICES),
    ):
        if value not in choices:
            raise SpecError(f"{flag} {value!r} is not a choice; valid options: {', '.join(choices)}")


def chosen_attention(upstream: UpstreamDrafter, window_rule: str, block_attention: str) -> tuple[dict, str]:
    """(window fields, block attention) of the portable config: the trainer's unless an option overrides it."""
    fields = {key: upstream.fields[key] for key in ("window_rule",) if key in upstream.fields}
    if window_rule != TRAINER:
        if "sliding_window" not in upstream.fields and window_rule != "per_slot":
            raise SpecError(f"--window-rule {window_rule}: the checkpoint has no sliding layers; drop the option")
        fields["window_rule"] = window_rule
    return fields, upstream.block_attention if block_attention == TRAINER else block_attention


def _same_matrix(stored: torch.Tensor, own: torch.Tensor) -> bool:
    """Equal up to the rounding of the dtype a checkpoint stored it in (bf16 at worst)."""
    return tuple(stored.shape) == tuple(own.shape) and torch.allclose(
        stored.float(), own.detach().float().cpu(), rtol=1e-2, atol=1e-3
    )


def _draft_rows(upstream: UpstreamDrafter, config: DrafterConfig, source: str) -> torch.Tensor | None:
    """Target ids of a draft vocabulary (checked, and against `t2d` when shipped), or None for the full one."""
    if config.draft_vocab_size is None:
        return None
    rows = target_ids_of(upstream.weights["d2t"])
    check_draft_vocab(rows, config, f"{source}: d2t")
    t2d = upstream.target_side.get("t2d")
    if t2d is not None and sorted(t2d.nonzero()[:, 0].tolist()) != sorted(rows.tolist()):
        raise SpecError(f"{source}: t2d and d2t name different draft vocabularies; the checkpoint is inconsistent")
    return rows


def embedding_and_head(
    upstream: UpstreamDrafter, config: DrafterConfig, target: TargetModel, source: str
) -> dict[str, torch.Tensor]:
    """The drafter's own `embed_tokens` and `lm_head` to write, or {} when it embeds and scores with the target's.

    A drafter of the target's width whose shipped tensors are the target's (its head's rows at the draft ids for a
    draft vocabulary) shares them, as every engine then does; one that ships others keeps its own (a missing one
    taken from the target). A drafter of another width must ship both: it cannot use the target's."""
    width = target.config.hidden_size
    targets = target.embedding_and_head(_draft_rows(upstream, config, source))
    dtype = upstream.weights["fc.weight"].dtype  # one dtype per checkpoint, the layers'
    shipped = {name: upstream.target_side[name].to(dtype) for name in targets if name in upstream.target_side}
    if config.hidden_size != width:
        missing = sorted(set(targets) - set(shipped))
        if missing:
            raise SpecError(
                f"{source}: a drafter {config.hidden_size} wide for a {width}-wide target needs its own "
                f"embed_tokens and lm_head, and the checkpoint lacks {missing}; it cannot be imported"
            )
        return shipped
    if all(_same_matrix(stored, targets[name]) for name, stored in shipped.items()):
        return {}
    return {name: shipped.get(name, own.to(dtype).clone()) for name, own in targets.items()}


def check_target_shape(upstream: UpstreamDrafter, target_dir: Path, source: Path) -> None:
    """The upstream's own record of its target (depth, width) against the target's config.json, read alone."""
    from transformers import AutoConfig

    check_target_dir(target_dir)
    try:
        target_config = AutoConfig.from_pretrained(str(target_dir)).get_text_config()
    except (OSError, ValueError, KeyError) as error:
        raise SpecError(f"target={target_dir}: transformers could not read its config.json ({error})") from None
    layers, width = target_config.num_hidden_layers, target_config.hidden_size
    if upstream.num_target_layers not in (None, layers):
        raise SpecError(
            f"{source}: num_target_layers = {upstream.num_target_layers}, the target {str(target_dir)!r} has "
            f"{layers} layers; import it for the target it was trained for"
        )
    if upstream.target_hidden_size not in (None, width):
        raise SpecError(
            f"{source}: target_hidden_size = {upstream.target_hidden_size}, the target {str(target_dir)!r} is "
            f"{width} wide; import it for the target it was trained for"
        )


def import_drafter(
    source: Path,
    target_dir: Path,
    out: Path,
    layout: str = "auto",
    force: bool = False,
    window_rule: str = TRAINER,
    block_attention: str = TRAINER,
) -> ImportResult:
    """Read `source` in an upstream layout, bind it to the target at `target_dir`, write a portable checkpoint to
    `out` (atomically; an existing output is replaced only if it is a drafter, or with `force`). Sliding windows
    and block attention are the trainer's (layouts.TRAINER_RULES) unless `window_rule` / `block_attention` choose."""
    source, out = Path(source), Path(out)
    check_import_options(window_rule, block_attention)
    upstream = read_upstream(source, layout)
    windows, mode = chosen_attention(upstream, window_rule, block_attention)
    check_output_dir(out, "drafter", inputs=(source, target_dir), force=force)  # before the target loads
    check_target_shape(upstream, Path(target_dir), source)  # from its config.json: before the weights load
    target = TargetModel.load(target_dir)
    config = parse_config(
        {
            "variant": {**(upstream.variant or {"kind": "parallel"}), "block_attention": mode},
            **upstream.fields,
            **windows,
            "own_embeddings": upstream.fields["hidden_size"] != target.config.hidden_size,
            "target": target.binding(upstream.verifier),
        },
        f"{source} ({upstream.layout} layout)",
    )
    own = embedding_and_head(upstream, config, target, str(source))
    check_weight_values(str(source), own)
    if own and not config.own_embeddings:  # the target's width, but trained its own
        config = config.model_copy(update={"own_embeddings": True})
    weights = {**upstream.weights, **own}
    check_weight_shapes(config, {name: tuple(t.shape) for name, t in weights.items()}, str(source))
    save_drafter(out, config, weights, force=force)
    target.load_drafter(out)  # the written checkpoint loads and binds, as every backend will load it
    return ImportResult(out, config, upstream.layout, upstream.rules)
