"""Reading and writing drafter checkpoints: `config.json` + `model.safetensors`, atomically, never unpickling."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .spec import DrafterConfig, SpecError, read_config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def write_dir_atomically(out_dir: Path, write: "callable[[Path], None]") -> Path:
    """Run `write(tmp_dir)`, then rename tmp_dir to out_dir; on any error nothing is left at out_dir."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write(tmp_dir)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint should read like any directory
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp_dir, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp_dir, out_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return out_dir


def save_drafter(out_dir: Path, config: DrafterConfig, state_dict: dict[str, torch.Tensor]) -> Path:
    """Write a checkpoint; weights are stored contiguous, in their own dtype."""
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state_dict.items()}

    def write(tmp: Path) -> None:
        (tmp / CONFIG_FILE).write_text(json.dumps(config.to_json_dict(), indent=2) + "\n")
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "portable_spec_format": "1"})

    return write_dir_atomically(Path(out_dir), write)


def load_drafter_files(ckpt_dir: Path) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """Validated config and raw drafter weights (safetensors only: loading never runs pickled code)."""
    ckpt_dir = Path(ckpt_dir)
    config = read_config(ckpt_dir)
    weights_path = ckpt_dir / WEIGHTS_FILE
    if not weights_path.exists():
        raise SpecError(f"{weights_path}: not found; a drafter checkpoint needs {WEIGHTS_FILE} beside config.json")
    return config, load_file(str(weights_path))
