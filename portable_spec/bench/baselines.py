"""What a user would otherwise run: HF `generate` greedy and HF prompt-lookup decoding (`prompt_lookup_num_tokens`),
one prompt at a time, stopping at the same stop tokens; timed by the caller (bench/evaluate.py), like every row."""

from __future__ import annotations

import torch

from portable_spec.core.target import TargetModel


def hf_name(prompt_lookup_num_tokens: int | None) -> str:
    return f"HF prompt lookup ({prompt_lookup_num_tokens})" if prompt_lookup_num_tokens else "HF generate"


@torch.inference_mode()
def hf_generate(
    target: TargetModel,
    prompt: list[int],
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...],
    prompt_lookup_num_tokens: int | None = None,
) -> list[int]:
    """Greedy HF `generate` (or prompt lookup when prompt_lookup_num_tokens is set) of one prompt, output cut at
    the first stop token exactly as the reference loop cuts it."""
    extra = {"prompt_lookup_num_tokens": prompt_lookup_num_tokens} if prompt_lookup_num_tokens else {}
    eos = list(stop_token_ids) or None
    ids = torch.tensor([prompt], device=target.device)
    out = target.model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=(eos or [0])[0],
        **extra,
    )
    generated = out[0, len(prompt) :].tolist()
    for index, token in enumerate(generated):
        if token in stop_token_ids:
            return generated[: index + 1]
    return generated
