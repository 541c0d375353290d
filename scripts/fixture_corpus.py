"""Training text that every machine has: the Python standard library's source, split by file into train/held-out.

The split is a hash of each file's relative path, so it does not depend on directory order; the shipped
fixtures record which Python produced them (regenerating on another version gives a different corpus).
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

EOS, MASK, PAD = "<|endoftext|>", "<|mask|>", "<|pad|>"
SPECIAL_TOKENS = [EOS, MASK, PAD]
_EXCLUDED_PARTS = {"test", "tests", "site-packages", "idlelib", "turtledemo", "__pycache__", "lib2to3", "ensurepip"}


@dataclass
class CorpusSplit:
    train: list[Path]
    heldout: list[Path]


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not _EXCLUDED_PARTS & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def split_files(files: list[Path], root: Path, heldout_percent: int = 10) -> CorpusSplit:
    """A file is held out when the first byte of sha1(relative path) mod 100 < heldout_percent."""
    split = CorpusSplit(train=[], heldout=[])
    for path in files:
        bucket = hashlib.sha1(path.relative_to(root).as_posix().encode()).digest()[0] % 100
        (split.heldout if bucket < heldout_percent else split.train).append(path)
    return split


def read_texts(files: list[Path], max_bytes: int) -> list[str]:
    """File texts in order until max_bytes; undecodable files are skipped."""
    texts, total = [], 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) with EOS, MASK (the drafter's mask slot) and PAD specials."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=PAD, mask_token=MASK)


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts tokenized and joined with EOS: one 1-D int64 tensor."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(encoded)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def sample_windows(stream: torch.Tensor, seq_len: int, batch: int, generator: torch.Generator) -> torch.Tensor:
    """[batch, seq_len] random windows of the stream (deterministic given the generator)."""
    starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=generator)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])
