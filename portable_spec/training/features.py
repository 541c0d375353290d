"""Target features computed once per distillation shard and cached (bf16), so a drafter training step costs only
the drafter: running a 135M target on every batch made CPU training ~25 s/step and taught nothing in 50 steps.

`features-NNNNN.safetensors` holds `features` [tokens in shard, len(layer_ids) * H], row-aligned with the shard's
flat `tokens`; the layer ids and target fingerprint are in its metadata and checked when read.

Cached or online target features: the one rule that picks between them.

Cached features cost one target pass per token, once, then disk (bf16, len(layer_ids) x hidden per token: 24 KB a
token for an 8B target's 3 layers, 2.4 TB for 100M tokens) and memory, since training holds them all on its
device. Online features cost a target forward per sequence per pass in every step, and nothing stored. `auto`
caches what fits comfortably in both and computes the rest online, as large runs do.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from portable_spec.core.outputs import write_file_atomically
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training.config import FeatureMode
from portable_spec.training.parallel import SINGLE, Ranks
from portable_spec.training.replies import Sequences, load_sequences, read_shard
from portable_spec.training.work_dir import changed_settings


@torch.no_grad()
def sequence_features(target: TargetModel, sequences: list[torch.Tensor], layer_ids: list[int]) -> list[torch.Tensor]:
    """Features [n_i, F] of each sequence, batched with right padding (causal: padding never leaks backwards)."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.int64)
    valid = torch.zeros(len(sequences), width, dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], valid[row, : len(seq)] = seq, True
    positions = torch.arange(width).expand(len(sequences), -1)
    device = target.device
    features = target.features(ids.to(device), positions.to(device), valid.to(device), layer_ids)
    return [features[row, : len(seq)].to("cpu", torch.bfloat16) for row, seq in enumerate(sequences)]


def cache_features(
    target: TargetModel,
    data_dir: Path,
    layer_ids: list[int],
    batch_size: int = 4,
    lock: Callable[[], AbstractContextManager] = nullcontext,
    ranks: Ranks = SINGLE,
    lockstep: bool = False,
) -> None:
    """Write features-NNNNN.safetensors beside each shard that lacks one (resumable, each file atomic); `lock()` is
    held while there is work to do. With several ranks each caches its share (the caller waits for all), or with
    `lockstep` (a target sharded over the ranks, whose forward every rank must join) all run every pass and rank 0
    writes."""
    shards = sorted(Path(data_dir).glob("shard-*.safetensors"))
    meta = {"layer_ids": json.dumps(layer_ids), "fingerprint": target.fingerprint}
    todo = [s for s in shards if not _features_path(s).exists() or _read_meta(_features_path(s)) != meta]
    if todo:
        mine = todo if lockstep else ranks.share(todo)
        with lock():
            if mine:
                _cache(target, mine, layer_ids, batch_size, meta, write=ranks.main or not lockstep)


def _cache(
    target: TargetModel, todo: list[Path], layer_ids: list[int], batch_size: int, meta: dict, write: bool = True
) -> None:
    total = sum(int(read_shard(s).offsets[-1]) for s in todo)
    bar = tqdm(total=total, unit="tok", desc="target features")
    for shard in todo:
        sequences = read_shard(shard)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences.sequence(i)))  # similar lengths batch well
        rows: dict[int, torch.Tensor] = {}
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for index, feats in zip(
                chunk, sequence_features(target, [sequences.sequence(i) for i in chunk], layer_ids)
            ):
                rows[index] = feats
            bar.update(sum(len(sequences.sequence(i)) for i in chunk))
        features = torch.cat([rows[i] for i in range(len(sequences))])
        tensors = {"features": features.contiguous()}
        if not write:
            continue
        write_file_atomically(
            _features_path(shard), lambda tmp, tensors=tensors: save_file(tensors, str(tmp), metadata=meta)
        )
    bar.close()


def _features_path(shard: Path) -> Path:
    return shard.with_name(shard.name.replace("shard-", "features-"))


def _read_meta(path: Path) -> dict:
    with safe_open(str(path), "pt") as handle:
        return dict(handle.metadata() or {})


@dataclass
class FeatureDataset:
    """Distillation sequences with their target features: cached in memory, or (features None) computed by the
    target as each batch is drawn ("online"); what training batches are drawn from."""

    sequences: Sequences
    features: torch.Tensor | None  # [N, F] bf16, row-aligned with sequences.tokens; None: online

    @staticmethod
    def load(data_dir: Path, layer_ids: list[int], fingerprint: str) -> "FeatureDataset":
        shards = sorted(Path(data_dir).glob("shard-*.safetensors"))
        parts, features = [], []
        for shard in shards:
            path = _features_path(shard)
            if not path.exists():
                continue  # a shard whose features are not cached yet is left out, never half-used
            meta = _read_meta(path)
            cached = {"layer_ids": json.loads(meta.get("layer_ids", "null")), "fingerprint": meta.get("fingerprint")}
            changed = changed_settings(
                cached, {"layer_ids": layer_ids, "fingerprint": fingerprint}, words=("cached", "now")
            )
            if changed:
                raise SpecError(
                    f"{path}: cached for another target or layer set ({'; '.join(changed)}); delete the "
                    "features-*.safetensors files to recompute"
                )
            parts.append(read_shard(shard))
            try:
                features.append(load_file(str(path))["features"])
            except (SafetensorError, OSError, KeyError) as error:
                raise SpecError(
                    f"{path}: not a readable feature file ({error}); delete it and rerun to recompute it"
                ) from None
        if not parts:
            raise SpecError(f"{data_dir}: no cached features; run the feature step (portable-spec train does)")
        return FeatureDataset(Sequences.concat(parts), torch.cat(features))

    def to(self, device: torch.device | str) -> "FeatureDataset":
        """Tokens and features on `device` (where batches are then gathered); offsets stay on the CPU, where the
        batch's lengths and anchors are drawn."""
        sequences = Sequences(self.sequences.tokens.to(device), self.sequences.offsets, self.sequences.prompt_lens)
        return FeatureDataset(sequences, None if self.features is None else self.features.to(device))

    def lengths(self, indices: torch.Tensor, max_len: int) -> torch.Tensor:
        offsets = self.sequences.offsets
        return (offsets[indices + 1] - offsets[indices]).clamp(max=max_len)

    def anchors(
        self, indices: list[int], block_size: int, anchors_per_seq: int, max_len: int, generator: torch.Generator
    ) -> torch.Tensor:
        """Anchors [B, A] (CPU) drawn in each picked reply (anchor + k <= n after the max_len cut), row by row from
        the generator: the same for a whole batch whichever rows of it a rank then gathers."""
        picked = torch.tensor(indices, dtype=torch.int64)
        lengths, prompt_lens = self.lengths(picked, max_len), self.sequences.prompt_lens[picked]
        anchors = torch.zeros(len(indices), anchors_per_seq, dtype=torch.int64)
        for row in range(len(indices)):
            low, high = max(int(prompt_lens[row]), 1), int(lengths[row]) - block_size  # anchors in [low, high]
            anchors[row] = low + torch.randint(0, max(high - low + 1, 1), (anchors_per_seq,), generator=generator)
        return anchors

    def gather(
        self, indices: list[int], anchors: torch.Tensor, max_len: int, target: TargetModel | None = None, layer_ids=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [B, T], features [B, T, F] (fp32, zero past each sequence's end) and anchors [B, A] on the
        dataset's device. Features come from the cache, or with none cached from `target` at `layer_ids` (a
        forward pass under no_grad, in the target's dtype)."""
        picked = torch.tensor(indices, dtype=torch.int64)
        starts, lengths = self.sequences.offsets[picked], self.lengths(picked, max_len)
        device = self.sequences.tokens.device
        slots = torch.arange(int(lengths.max()))
        rows = (starts[:, None] + slots).clamp(max=len(self.sequences.tokens) - 1).to(device)  # [B, T] flat row ids
        inside = (slots < lengths[:, None]).to(device)  # [B, T]
        tokens = torch.where(inside, self.sequences.tokens[rows].long(), 0)
        if self.features is not None:
            features = self.features[rows].float()
        elif target is not None and layer_ids is not None:
            positions = slots.to(device).expand(len(indices), -1)
            features = target.features(tokens, positions, inside, layer_ids).float()
        else:
            raise SpecError("no cached features and no target to compute them: pass target and layer_ids")
        features = torch.where(inside[..., None], features, 0.0)
        return tokens, features, anchors.to(device)

    def batch(
        self, indices: list[int], block_size: int, anchors_per_seq: int, max_len: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A whole batch from cached features: anchors drawn from the generator (the same on every device), then
        gathered (see anchors and gather)."""
        anchors = self.anchors(indices, block_size, anchors_per_seq, max_len, generator)
        return self.gather(indices, anchors, max_len)

    def trainable(self, block_size: int, max_len: int) -> list[int]:
        """Sequences with at least one full block inside their reply (after the max_len cut)."""
        lengths = (self.sequences.offsets[1:] - self.sequences.offsets[:-1]).clamp(max=max_len)
        return [
            i
            for i in range(len(self.sequences))
            if int(lengths[i]) - block_size >= max(int(self.sequences.prompt_lens[i]), 1)
        ]


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
