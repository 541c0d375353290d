"""Prompts the target writes itself (Magpie, Xu et al. 2024): sampled right after its chat template's user header,
each ending where the template closes a user turn. An aligned chat model fills an empty user turn with the kind of
request it was tuned on, so these prompts add what the target expects to be asked to what a prompt set holds,
without a data set. Kept only when finished (closed within the length cap), non-empty and new; de-duplicated by
text. The held-out set is untouched: it stays the data set's held-out conversations.
"""

from __future__ import annotations

from collections.abc import Callable

from portable_spec.core.spec import SpecError
from portable_spec.training.config import ReplyConfig
from portable_spec.training.replies import sampling_for
from portable_spec.training.sharegpt import chat_prompt_ids

MARK = "\u2063PORTABLE_SPEC_USER_TEXT\u2063"  # a string no template contains, to find where the user's text goes
TEMPERATURE, TOP_P = 1.0, 1.0  # Magpie's sampling: the target's own distribution over requests
MAX_ROUNDS = 8  # batches of `count` samples tried before giving up on reaching `count` new prompts
ID_PREFIX = "target-"  # prompt ids: target-<seed>-<n>

# (prompts, max_new_tokens, sample=replies.Sampling, stop=token id) -> generated ids per prompt, as the reply
# stage's writers (replies.reply_writer: HF generate, vLLM)
Writer = Callable[..., list[list[int]]]


def user_turn_template(tokenizer) -> tuple[list[int], int]:
    """(ids of the chat template up to where a user's text starts, the token that closes a user turn)."""
    if not getattr(tokenizer, "chat_template", None):
        raise SpecError(
            "--target-prompts: the target's tokenizer has no chat template, so there is no user turn for the target "
            "to write; use a chat model's tokenizer or drop --target-prompts"
        )
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False)
    header, _, closing = rendered.partition(MARK)
    closing_ids = tokenizer(closing, add_special_tokens=False)["input_ids"]
    if not closing_ids:
        raise SpecError("--target-prompts: the chat template does not close a user turn; drop --target-prompts")
    return tokenizer(header, add_special_tokens=False)["input_ids"], int(closing_ids[0])


def target_written_prompts(
    tokenizer, write: Writer, count: int, *, seed: int, max_prompt_tokens: int, batch: int = 64
) -> list[dict]:
    """Up to `count` distinct prompts [{"id", "ids"}] the target wrote, with the chat template applied as for any
    prompt; the same (target, seed, count, batch) gives the same prompts."""
    header, close = user_turn_template(tokenizer)
    sampling = ReplyConfig(reply_temperature=TEMPERATURE, reply_top_p=TOP_P, reply_seed=seed)
    seen: set[str] = set()
    prompts: list[dict] = []
    for round_ in range(MAX_ROUNDS * max(1, -(-count // batch))):
        if len(prompts) >= count:
            break
        written = write([header] * batch, max_prompt_tokens, sampling_for(sampling, round_, 1), close)
        for row in written:
            if not row or row[-1] != close:  # not closed within the cap: an unfinished request
                continue
            text = tokenizer.decode(row[:-1], skip_special_tokens=True).strip()
            if not text or text in seen:
                continue
            seen.add(text)
            ids = chat_prompt_ids(tokenizer, (("user", text),))
            if len(ids) <= max_prompt_tokens and len(prompts) < count:
                prompts.append({"id": f"{ID_PREFIX}{seed}-{len(prompts)}", "ids": ids})
    return prompts


def is_target_written(prompt: dict) -> bool:
    """A prompts-file entry the target wrote (not from the data set)."""
    return str(prompt.get("id", "")).startswith(ID_PREFIX)
