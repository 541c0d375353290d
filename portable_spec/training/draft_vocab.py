"""The draft-vocabulary stage: the tokens a reduced-vocabulary drafter scores (EAGLE-3's draft vocabulary; DFlash
scores the whole vocabulary), counted over the training replies."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from portable_spec.training.replies import load_sequences


def frequent_tokens(data_dir: Path, size: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent reply tokens (plus `always`, e.g. EOS), sorted: EAGLE-3's draft vocabulary."""
    sequences = load_sequences(data_dir)
    counts: Counter[int] = Counter()
    for index in range(len(sequences)):
        counts.update(sequences.sequence(index)[int(sequences.prompt_lens[index]) :].tolist())
    chosen = [t for t in always if t is not None]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    fill = 0
    while len(chosen) < size:  # a tiny data set: pad with unused ids so the size is what was asked
        if fill not in chosen:
            chosen.append(fill)
        fill += 1
    return torch.tensor(sorted(chosen), dtype=torch.int64)
