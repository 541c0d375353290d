"""portable-spec check: validate a drafter checkpoint (config, weights: shapes, dtypes, finite values) and, with
--target, its binding to that target."""

from __future__ import annotations

import argparse

import torch

from portable_spec.core.checkpoint import load_drafter_files
from portable_spec.core.drafter import load_drafter
from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_WEIGHTS = {"d2t": torch.int64}  # the draft vocabulary's offsets; every other tensor is a float weight


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("drafter", help="Drafter checkpoint directory.")
    parser.add_argument("--target", help="Target model directory to check the drafter against.")


def check_weight_values(source: str, weights: dict[str, torch.Tensor]) -> None:
    """Every float weight finite and in a float dtype the loaders handle; index tensors in their integer dtype."""
    wrong = [
        f"{name} ({t.dtype})"
        for name, t in weights.items()
        if t.dtype != INDEX_WEIGHTS.get(name, t.dtype) or (name not in INDEX_WEIGHTS and t.dtype not in FLOAT_DTYPES)
    ]
    if wrong:
        raise SpecError(
            f"{source}: unexpected dtypes {wrong[:4]}; weights are float32/bfloat16/float16 and d2t int64: "
            "re-save the checkpoint with portable-spec"
        )
    broken = [name for name, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if broken:
        raise SpecError(
            f"{source}: non-finite values (NaN or inf) in {broken[:4]}; the drafter would draft garbage "
            "(verification would stay lossless, acceptance would collapse): retrain or restore it"
        )


def run(args: argparse.Namespace) -> int:
    _, weights = load_drafter_files(args.drafter)
    check_weight_values(f"{args.drafter}", weights)
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
