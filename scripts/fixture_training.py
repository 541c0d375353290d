"""The fixture drafters' trainer (scripts/make_fixtures.py and the tests): the training loop on a raw token
stream, the target running on every batch. Not the product's recipe (portable_spec.training.recipe), which trains
on the target's own replies."""

from __future__ import annotations

from pathlib import Path

import torch
from fixture_corpus import sample_windows

from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training.batches import step_generator
from portable_spec.training.config import TrainConfig
from portable_spec.training.loop import train_loop


def stream_batches(target: TargetModel, stream: torch.Tensor, config: "TrainConfig", layer_ids: list[int], span: int):
    """draw(step, rows) for training on a raw token stream: global batch `step` is random windows and anchors from
    the step's generator; the frozen target computes the features of the rows asked."""

    def draw(step: int, rows: slice = slice(None)):
        generator = step_generator(config.seed, step)
        tokens = sample_windows(stream, config.seq_len, config.batch_size, generator)[rows].to(target.device)
        scores = torch.rand(config.batch_size, config.seq_len - span, generator=generator)[rows]
        anchors = (1 + scores.argsort(dim=1)[:, : config.anchors_per_seq]).to(target.device)  # distinct, [1, T - span]
        positions = torch.arange(config.seq_len, device=target.device).expand(len(tokens), -1)
        features = target.features(tokens, positions, torch.ones_like(tokens, dtype=torch.bool), layer_ids)
        return tokens, features, anchors

    return draw


def train_drafter(
    target: TargetModel,
    drafter_config: DrafterConfig,
    stream: torch.Tensor,
    config: TrainConfig,
    out_dir: Path,
    state_dir: Path | None = None,
    progress: bool = True,
    heldout=None,
) -> Drafter:
    """Train on a raw token stream (the fixtures' recipe): the target runs on every batch; `heldout` as in
    train_loop."""
    vocab = target.vocab_size
    if stream.ndim != 1 or stream.dtype.is_floating_point or stream.dtype == torch.bool:
        raise SpecError(
            f"stream: a 1-D tensor of integer token ids is needed, got {stream.dtype} of shape {tuple(stream.shape)}"
        )
    if len(stream) < config.seq_len:
        raise SpecError(
            f"stream has {len(stream)} tokens, fewer than seq_len={config.seq_len}; give more text or lower --seq-len"
        )
    if int(stream.min()) < 0 or int(stream.max()) >= vocab:
        raise SpecError(
            f"stream holds token ids outside [0, {vocab}) (min {int(stream.min())}, max "
            f"{int(stream.max())}); tokenize with the target's tokenizer"
        )
    draw = stream_batches(target, stream, config, drafter_config.target_layer_ids, drafter_config.label_span)
    return train_loop(target, drafter_config, draw, config, out_dir, state_dir, progress, heldout=heldout)
