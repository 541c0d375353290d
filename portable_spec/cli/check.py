"""portable-spec check: validate a drafter checkpoint (config, weights: shapes, dtypes, finite values) and, with
--target, its binding to that target."""

from __future__ import annotations

import argparse

from portable_spec.core.checkpoint import load_drafter_files
from portable_spec.core.drafter import load_drafter
from portable_spec.core.target import TargetModel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("drafter", help="Drafter checkpoint directory.")
    parser.add_argument("--target", help="Target model directory to check the drafter against.")


def run(args: argparse.Namespace) -> int:
    _, weights = load_drafter_files(args.drafter)  # refuses wrong dtypes and non-finite values by name
    if args.target:
        drafter = TargetModel.load(args.target).load_drafter(args.drafter)
    else:
        drafter = load_drafter(args.drafter)
    config = drafter.config
    print(
        f"ok: {config.kind} drafter, block_size={config.block_size}, {config.num_hidden_layers} layers, "
        f"target_layer_ids={config.target_layer_ids}, trained for {config.target.model_id!r}; "
        f"{len(weights)} tensors finite" + (" (matches the given target)" if args.target else "")
    )
    return 0
