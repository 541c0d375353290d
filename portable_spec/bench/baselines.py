"""What a user would otherwise run, timed the same way as the reference loop: HF `generate` greedy and HF
prompt-lookup decoding (`prompt_lookup_num_tokens`), one prompt at a time, stopping at the same stop tokens."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from portable_spec.core.decode import synchronize
from portable_spec.core.target import TargetModel


@dataclass
class BaselineRun:
    name: str
    tokens: list[list[int]]
    seconds: float


@torch.inference_mode()
def hf_generate(
    target: TargetModel,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_token_ids: tuple[int, ...],
    prompt_lookup_num_tokens: int | None = None,
) -> BaselineRun:
    """Greedy HF `generate` (or prompt lookup when prompt_lookup_num_tokens is set), batch 1, output cut at the
    first stop token exactly as the reference loop cuts it."""
    model, tokens, seconds = target.model, [], 0.0
    extra = {"prompt_lookup_num_tokens": prompt_lookup_num_tokens} if prompt_lookup_num_tokens else {}
    eos = list(stop_token_ids) or None
    for prompt in prompts:
        ids = torch.tensor([prompt], device=target.device)
        synchronize(target.device)
        start = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=(eos or [0])[0],
            **extra,
        )
        synchronize(target.device)
        seconds += time.perf_counter() - start
        generated = out[0, len(prompt) :].tolist()
        for index, token in enumerate(generated):
            if token in stop_token_ids:
                generated = generated[: index + 1]
                break
        tokens.append(generated)
    name = f"HF prompt lookup ({prompt_lookup_num_tokens})" if prompt_lookup_num_tokens else "HF generate"
    return BaselineRun(name, tokens, seconds)
