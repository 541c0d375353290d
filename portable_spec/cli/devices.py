"""--device, checked before any model loads (a device this torch build can use), and the --dtype names."""

from __future__ import annotations

import torch

from portable_spec.core.spec import SpecError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # --dtype NAME -> dtype


def check_device(device: str) -> torch.device:
    """--device names a device this torch can use (before any model loads)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise SpecError(f"--device {device!r}: not a torch device; use cpu, cuda or cuda:N") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise SpecError(
                f"--device {device}: this torch build sees no CUDA device; use --device "
                "cpu, or install a CUDA build of torch on a GPU machine"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise SpecError(
                f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) visible; use "
                f"cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    elif parsed.type != "cpu":
        raise SpecError(f"--device {device}: portable-spec runs on cpu or cuda")
    return parsed
