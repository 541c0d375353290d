"""portable-spec import: `import SOURCE OUT --target T` reads a DFlash drafter in an upstream layout (z-lab/dflash,
SpecForge, vLLM speculators), binds it to the target and writes a portable checkpoint every backend loads."""

from __future__ import annotations

import argparse
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="Upstream drafter directory: config.json + model.safetensors.")
    parser.add_argument("out", help="Output directory for the portable checkpoint (new, empty, or a drafter).")
    parser.add_argument("--target", required=True, help="Target model directory the drafter is for.")
    parser.add_argument(
        "--layout",
        default="auto",
        help="dflash (z-lab/SpecForge; zlab and specforge are aliases) | speculators; default auto: what config.json "
        "says.",
    )
    parser.add_argument(
        "--window-rule",
        default="trainer",
        help="Sliding windows: trainer (default: what the code that trained it computes; speculators: per_anchor, "
        "z-lab/SpecForge: per_slot) | per_slot (q - k < W, as vLLM and SGLang serve every DFlash drafter) | "
        "per_anchor (k >= anchor - W for every slot).",
    )
    parser.add_argument(
        "--block-attention",
        default="trainer",
        help="Block slots in each layer: trainer (default: what the checkpoint's config means to its trainer) | "
        "bidirectional | causal | causal_in_sliding_layers.",
    )
    parser.add_argument(
        "--force", action="store_true", help="Replace OUT even if it holds files portable-spec did not write."
    )


def run(args: argparse.Namespace) -> int:
    from portable_spec.adapters.upstream.importer import import_drafter

    start = time.perf_counter()
    result = import_drafter(
        args.source, args.target, args.out, args.layout, args.force, args.window_rule, args.block_attention
    )
    config = result.config
    vocab = f", draft vocabulary {config.draft_vocab_size}" if config.draft_vocab_size else ""
    if config.has_windows:
        vocab += f", layers {config.layer_types} (window {config.sliding_window}, {config.window_rule})"
    if config.kind == "parallel" and config.variant.block_attention != "bidirectional":
        vocab += f", block attention {config.variant.block_attention}"
    if config.own_embeddings:
        vocab += f", own embedding and head ({config.hidden_size} wide, target {config.target.hidden_size})"
    print(
        f"wrote {result.out}: {result.layout} DFlash drafter as a portable {config.kind} drafter, "
        f"block_size={config.block_size}, {config.num_hidden_layers} layers, target_layer_ids="
        f"{config.target_layer_ids}{vocab}, bound to {args.target} ({time.perf_counter() - start:.1f}s)"
    )
    for rule in result.rules:
        print(f"sliding layers: {rule}")
    return 0
