"""Chat prompts for a target, as token ids: ShareGPT-style human turns with the target's chat template, length-capped,
split train / held-out by conversation id (see sharegpt.py). The held-out set is always the held-out conversations'
first turns, whatever the training prompts are, so held-out figures stay comparable across runs."""

from __future__ import annotations

import json
from pathlib import Path

from portable_spec.core.spec import SpecError
from portable_spec.training.sharegpt import (
    Prompt,
    PromptTurns,
    chat_prompt_ids,
    iter_conversations,
    split_prompts,
    turn_prompts,
)

LENGTH_WINDOW = 4096  # training prompts are length-sorted within windows this long (see length_bucketed)


def tokenized(tokenizer, prompts: list[Prompt], max_prompt_tokens: int, limit: int | None = None) -> list[dict]:
    """[{"id", "ids"}] for prompts whose templated length is at most max_prompt_tokens, in order, up to limit."""
    out = []
    for prompt in prompts:
        if limit is not None and len(out) >= limit:
            break
        if prompt.characters > 8 * max_prompt_tokens:  # cheap pre-filter: cannot fit
            continue
        ids = chat_prompt_ids(tokenizer, prompt.messages)
        if len(ids) <= max_prompt_tokens:
            out.append({"id": prompt.conversation_id, "ids": ids})
    return out


def chat_prompt_split(
    tokenizer,
    data_path: Path,
    max_prompt_tokens: int,
    train_limit: int | None,
    heldout_limit: int | None,
    heldout_percent: int = 5,
    turns: PromptTurns = "first",
    context: bool = False,
    offset: int = 0,
) -> tuple[list[dict], list[dict]]:
    """(train, held-out) prompts: train from the chosen human turns of the train-split conversations, held-out from
    the held-out conversations' first turns; split by conversation, so no held-out conversation is ever trained on.
    The first `offset` train prompts that fit are skipped: a run after another (a warm start) gets prompts the
    earlier run with the same settings and train_limit <= offset never saw."""
    conversations = list(iter_conversations(Path(data_path)))  # read and parsed once for both splits
    train, _ = split_prompts(turn_prompts(conversations, data_path, turns, context), heldout_percent)
    _, heldout = split_prompts(turn_prompts(conversations, data_path, "first"), heldout_percent)
    limit = None if train_limit is None else offset + train_limit
    train_ids = length_bucketed(tokenized(tokenizer, train, max_prompt_tokens, limit)[offset:])
    heldout_ids = tokenized(tokenizer, heldout, max_prompt_tokens, heldout_limit)
    if not train_ids:
        if offset:
            raise SpecError(f"{data_path}: no training prompt is left after prompt_offset={offset}; lower it")
        raise SpecError(f"{data_path}: no training prompt fits max_prompt_tokens={max_prompt_tokens}; raise it")
    if train_limit is not None and len(train_ids) < train_limit:
        print(
            f"note: {data_path} gave {len(train_ids)} training prompts of the {train_limit} asked (--num-prompts): "
            f"that is every one that fits max_prompt_tokens={max_prompt_tokens}"
            + (f" after prompt_offset={offset}" if offset else ""),
            flush=True,
        )
    return train_ids, heldout_ids


def length_bucketed(prompts: list[dict], window: int = LENGTH_WINDOW) -> list[dict]:
    """Prompts sorted by length within consecutive windows: a reply batch then pads to similar lengths, while any
    prefix of whole windows is still the sample the file order gives (the reply stage may be cut at any shard)."""
    return [p for start in range(0, len(prompts), window) for p in sorted(prompts[start : start + window], key=_length)]


def _length(prompt: dict) -> int:
    return len(prompt["ids"])


def write_prompts(path: Path, prompts: list[dict]) -> None:
    Path(path).write_text(json.dumps(prompts) + "\n")


def read_prompts(path: Path) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SpecError(f"{path}: cannot read prompts ({error}); expected a JSON list of {{'id', 'ids'}}") from None
    if not isinstance(data, list) or not all(isinstance(p, dict) and isinstance(p.get("ids"), list) for p in data):
        raise SpecError(f"{path}: expected a JSON list of {{'id': str, 'ids': [int, ...]}}")
    return data
