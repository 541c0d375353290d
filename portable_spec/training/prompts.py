"""Chat prompts for a target, as token ids: ShareGPT-style human turns with the target's chat template, length-capped,
split train / held-out by conversation id (see sharegpt.py). The held-out set is always the held-out conversations'
first turns, whatever the training prompts are, so held-out figures stay comparable across runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from portable_spec.core.outputs import locked
from portable_spec.core.spec import SpecError, read_json_object
from portable_spec.training.config import PromptConfig
from portable_spec.training.sharegpt import (
    Prompt,
    PromptTurns,
    chat_prompt_ids,
    iter_conversations,
    split_prompts,
    turn_prompts,
)
from portable_spec.training.target_prompts import Writer, is_target_written, target_written_prompts
from portable_spec.training.work_dir import WorkDir, changed_settings

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


def prepare_prompts(
    tokenizer,
    data_path: Path | None,
    work_dir: Path,
    prompts: PromptConfig,
    target_writer: Callable[[], Writer] | None = None,
    *,
    seed: int = 0,
    batch: int = 64,
) -> list[list[int]]:
    """Train prompts (cached in work_dir): the data set's, then `prompts.target_prompts` the target writes
    (`target_writer()` makes the writer, only then; sampled from `seed`, `batch` a call); the held-out split is
    written beside them for benchmarks. A prepared work dir is reused only for the settings it was prepared with
    (else one error naming what changed)."""
    layout = WorkDir(work_dir)
    train_file, heldout_file, settings_file = layout.train_prompts, layout.heldout_prompts, layout.prompt_settings
    settings = prompts.model_dump()
    if data_path is not None:
        settings["data"] = Path(data_path).name
    if not train_file.exists():
        if data_path is None:
            raise SpecError(f"{work_dir}: holds no {train_file.name}; pass --data with a ShareGPT-style JSON file")
        with locked(layout.data_lock, f"--work-dir {work_dir}"):
            train, heldout = chat_prompt_split(
                tokenizer,
                data_path,
                prompts.max_prompt_tokens,
                prompts.num_prompts,
                prompts.heldout_prompts,
                turns=prompts.prompt_turns,
                context=prompts.prompt_context,
                offset=prompts.prompt_offset,
            )
            if prompts.target_prompts:
                if target_writer is None:
                    raise SpecError("--target-prompts needs the target to write them (no writer was given)")
                written = target_written_prompts(
                    tokenizer,
                    target_writer(),
                    prompts.target_prompts,
                    seed=seed,
                    max_prompt_tokens=prompts.max_prompt_tokens,
                    batch=batch,
                )
                print(f"prompts: the target wrote {len(written)} of {prompts.target_prompts} asked", flush=True)
                train = length_bucketed(train + written)
            write_prompts(heldout_file, heldout)
            settings_file.write_text(json.dumps(settings) + "\n")
            write_prompts(train_file, train)
    entries = read_prompts(train_file)
    from_data = [not is_target_written(entry) for entry in entries]
    if settings_file.is_file():  # work dirs prepared before the settings were recorded have none
        _check_prompt_settings(
            work_dir, read_json_object(settings_file, f"delete {work_dir} to start over"), settings, sum(from_data)
        )
    # the first num_prompts of the data set's (fewer than prepared is fine) and every prompt the target wrote
    kept = [index for index, data in enumerate(from_data) if data][: prompts.num_prompts]
    kept += [index for index, data in enumerate(from_data) if not data]
    return [entries[index]["ids"] for index in sorted(kept)]


def _check_prompt_settings(work_dir: Path, saved: dict, asked: dict, prepared: int) -> None:
    keys = [name for name in asked if name != "num_prompts" and name in saved]
    changed = changed_settings(saved, asked, keys, words=("prepared", "asked"), flags=True)
    if asked["num_prompts"] > prepared and prepared >= saved.get("num_prompts", prepared):
        changed.append(f"num-prompts: prepared {prepared}, asked {asked['num_prompts']}")
    if changed:
        raise SpecError(
            f"--work-dir {work_dir}: its prompts were prepared with other settings ({'; '.join(changed)}); "
            "use a new --work-dir for these, or ask for the prepared ones (fewer --num-prompts is fine)"
        )


def heldout_eval_prompts(work_dir: Path, count: int) -> list[list[int]]:
    """The first `count` held-out prompts, whose greedy replies measure acceptance while training (none when count
    is 0 or the work dir holds no held-out split; said when the split is empty)."""
    heldout_file = WorkDir(work_dir).heldout_prompts
    if not count or not heldout_file.is_file():
        return []
    prompts = [p["ids"] for p in read_prompts(heldout_file)][:count]
    if not prompts:  # said, not silent: the run then keeps its last drafter, not the best held out (issue 47)
        print(
            f"note: {heldout_file} holds no held-out prompt (the data set's conversations all fell in the training "
            "split): no held-out acceptance is measured and the last drafter is written; use a larger --data, "
            "or pass --heldout-eval-prompts 0 to say so"
        )
    return prompts
