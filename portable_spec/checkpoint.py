"""Reading and writing drafter checkpoints: `config.json` + `model.safetensors`, atomically, never unpickling."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .spec import DrafterConfig, SpecError, read_config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


OUTPUT_MARKER = ".portable-spec-output"  # names what kind of output a directory holds; only that kind replaces it


def _previous_output_kind(out_dir: Path) -> str | None:
    marker = out_dir / OUTPUT_MARKER
    if marker.is_file():
        return marker.read_text().strip()
    config = out_dir / CONFIG_FILE  # checkpoints written before the marker existed
    if config.is_file():
        try:
            data = json.loads(config.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if isinstance(data, dict) and "variant" in data and "format_version" in data:
            return "drafter"
    return None


def check_output_dir(out_dir: Path, kind: str, inputs: tuple = (), force: bool = False) -> None:
    """Refuse, before any work, an output path that would destroy what this program did not write: a file, or a
    non-empty directory that holds no previous output of the same kind (e.g. the drafter or target passed as input;
    `force` lifts this one rule), or a path equal to or inside one of `inputs` (the directories this command reads,
    never lifted)."""
    out_dir = Path(out_dir)
    for source in inputs:
        source = Path(source).resolve()
        if out_dir.resolve() == source or source in out_dir.resolve().parents:
            raise SpecError(f"output {out_dir} is {'' if out_dir.resolve() == source else 'inside '}the input "
                            f"{source}; write the output somewhere else (nothing was changed)")
    if out_dir.exists() and not out_dir.is_dir():
        raise SpecError(f"output {out_dir} is a file; pass a directory path (nothing was changed)")
    if out_dir.is_dir() and not force and any(out_dir.iterdir()):
        found = _previous_output_kind(out_dir)
        if found != kind:
            held = f"a portable-spec {found} output" if found else "files portable-spec did not write"
            raise SpecError(f"output {out_dir} is not empty and holds {held}, not a previous {kind} output; "
                            "pass a new or empty directory, or --force to replace it (nothing was changed)")
    probe = out_dir.parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise SpecError(f"output {out_dir}: {probe} is not writable; pass a directory you can write to")


def write_file_atomically(path: Path, write: "callable[[Path], None]") -> Path:
    """Run `write(tmp_path)` beside `path`, then rename it over `path`: readers never see a half-written file, and a
    failed write leaves nothing behind. The temp name keeps the suffix (matplotlib picks the format from it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_dir_atomically(out_dir: Path, write: "callable[[Path], None]", kind: str = "drafter",
                         force: bool = False) -> Path:
    """Run `write(tmp_dir)`, then rename tmp_dir to out_dir; on any error nothing is left at out_dir and a replaced
    previous output is restored. Only an empty directory or a previous output of the same `kind` is replaced."""
    out_dir = Path(out_dir)
    check_output_dir(out_dir, kind, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write(tmp_dir)
        (tmp_dir / OUTPUT_MARKER).write_text(kind + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_dir, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint should read like any directory
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if not out_dir.exists():
        try:
            os.replace(tmp_dir, out_dir)
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
        return out_dir
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    os.replace(out_dir, old)
    try:
        os.replace(tmp_dir, out_dir)
    except BaseException as error:
        os.replace(old, out_dir)  # put the previous output back
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise SpecError(f"could not replace {out_dir} ({error}); its previous contents were restored") from error
    shutil.rmtree(old)
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
    if not weights_path.is_file():
        what = "is a directory" if weights_path.is_dir() else "not found"
        raise SpecError(f"{weights_path}: {what}; a drafter checkpoint needs the file {WEIGHTS_FILE} beside config.json")
    try:
        return config, load_file(str(weights_path))
    except (SafetensorError, OSError, ValueError) as error:
        raise SpecError(f"{weights_path}: not a readable safetensors file ({error}); it is truncated, corrupt or "
                        "another format (pickles are never loaded): re-save the checkpoint with portable-spec") from None
