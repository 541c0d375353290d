"""Reading and writing drafter checkpoints: `config.json` + `model.safetensors`, atomically, never unpickling."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from portable_spec.core.outputs import write_dir_atomically
from portable_spec.core.spec import DrafterConfig, SpecError, read_config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_WEIGHTS = {"d2t": torch.int64}  # the draft vocabulary's offsets; every other tensor is a float weight


def check_weight_values(source: str, weights: dict[str, torch.Tensor]) -> None:
    """Every float weight finite and in a float dtype the loaders handle; index tensors in their integer dtype.
    Checked wherever a checkpoint is read or imported, so a broken drafter is refused by name before it drafts."""
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


def save_drafter(
    out_dir: Path,
    config: DrafterConfig,
    state_dict: dict[str, torch.Tensor],
    force: bool = False,
    owner: str | None = None,
) -> Path:
    """Write a checkpoint; weights are stored contiguous, in their own dtype. `owner` (a training work directory)
    is recorded, and only a checkpoint of the same owner is replaced without `force` (outputs.check_output_dir)."""
    return write_dir_atomically(
        Path(out_dir), lambda tmp: write_drafter_files(tmp, config, state_dict), force=force, owner=owner
    )


def save_drafter_cast(
    source: Path, out_dir: Path, dtype: torch.dtype = torch.bfloat16, force: bool = False
) -> dict[str, torch.Tensor]:
    """The drafter at source written to out_dir with its float weights in dtype (drafters ship in bf16: half the
    bytes, loaded into fp32); index tensors (d2t) keep theirs. Returns the weights written."""
    config, weights = load_drafter_files(source)
    cast = {name: (t.to(dtype) if t.is_floating_point() else t) for name, t in weights.items()}
    save_drafter(out_dir, config, cast, force=force)
    return cast


def write_drafter_files(directory: Path, config: DrafterConfig, state_dict: dict[str, torch.Tensor]) -> None:
    """config.json + model.safetensors into an existing directory (the inside of an atomic directory write)."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}
    (directory / CONFIG_FILE).write_text(json.dumps(config.to_json_dict(), indent=2) + "\n")
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt", "portable_spec_format": "1"})


def load_drafter_files(ckpt_dir: Path) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """Validated config and raw drafter weights (safetensors only: loading never runs pickled code; dtypes and
    finite values checked, check_weight_values)."""
    ckpt_dir = Path(ckpt_dir)
    config = read_config(ckpt_dir)
    weights_path = ckpt_dir / WEIGHTS_FILE
    if not weights_path.is_file():
        what = "is a directory" if weights_path.is_dir() else "not found"
        raise SpecError(
            f"{weights_path}: {what}; a drafter checkpoint needs the file {WEIGHTS_FILE} beside config.json"
        )
    try:
        weights = load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as error:
        raise SpecError(
            f"{weights_path}: not a readable safetensors file ({error}); it is truncated, corrupt or "
            "another format (pickles are never loaded): re-save the checkpoint with portable-spec"
        ) from None
    check_weight_values(str(ckpt_dir), weights)
    return config, weights
