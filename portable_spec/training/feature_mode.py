"""Cached or online target features: the one rule that picks between them.

Cached features cost one target pass per token, once, then disk (bf16, len(layer_ids) x hidden per token: 24 KB a
token for an 8B target's 3 layers, 2.4 TB for 100M tokens) and memory, since training holds them all on its
device. Online features cost a target forward per sequence per pass in every step, and nothing stored. `auto`
caches what fits comfortably in both and computes the rest online, as large runs do.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

import torch

from portable_spec.core.spec import DrafterConfig
from portable_spec.core.target import TargetModel
from portable_spec.training.distill_data import load_sequences

FeatureMode = Literal["auto", "online", "cached"]

DISK_SHARE = 0.5  # cached features may take at most this share of the work dir's free disk
MEMORY_SHARE = 0.25  # ... and of the training device's memory, where they are held


def device_memory(device: torch.device) -> int:
    """Bytes of memory on `device` (the GPU's, or the machine's RAM)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_features(
    mode: FeatureMode, target: TargetModel, config: DrafterConfig, data_dir: Path, work_dir: Path
) -> tuple[str, str]:
    """("cached" | "online", why): the asked mode, or for auto, cached when the features fit in DISK_SHARE of the
    free disk and MEMORY_SHARE of the device's memory."""
    tokens = int(load_sequences(data_dir).offsets[-1])
    width = len(config.target_layer_ids) * target.config.hidden_size
    size = tokens * width * 2  # bf16
    free = shutil.disk_usage(work_dir).free
    memory = device_memory(target.device)
    facts = f"{tokens:,} tokens x {width} x bf16 = {size / 2**30:.2f} GiB"
    if mode != "auto":
        return mode, f"asked; cached would be {facts}"
    if size <= DISK_SHARE * free and size <= MEMORY_SHARE * memory:
        return "cached", f"auto: {facts}, within half the free disk ({free / 2**30:.0f} GiB) and a quarter of " + (
            f"{target.device}'s memory ({memory / 2**30:.0f} GiB)"
        )
    return "online", f"auto: {facts}, more than half the free disk ({free / 2**30:.0f} GiB) or a quarter of " + (
        f"{target.device}'s memory ({memory / 2**30:.0f} GiB)"
    )
