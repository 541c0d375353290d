"""The core's choice of implementation per op: a registered Triton kernel on CUDA tensors (when triton imports),
the torch reference elsewhere.

Kernels are a layer above the core: they register themselves in the `portable_spec.kernels` entry-point group
(name -> module), so the core never names the kernels package. The decode loop calls `verify_op` every round and
the drafter's layers call `attention_op` for one block per request; nothing calls a kernel module directly. Force
an implementation with the `impl` argument or PORTABLE_SPEC_KERNELS=auto|torch|triton (the argument wins). Forcing "triton" on CPU
tensors needs TRITON_INTERPRET=1 set before triton is first imported (the interpreter; tests do this).
triton is imported here lazily, only when a Triton implementation is chosen.
"""

from __future__ import annotations

import importlib
import os
from functools import lru_cache
from importlib.metadata import entry_points
from types import ModuleType

import torch

from portable_spec.core.attention import block_attention_mask, injected_attention
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, target_probs
from portable_spec.core.verify import VerifyResult, check_chain_shapes, verify

IMPLS = ("auto", "torch", "triton")
ENV_VAR = "PORTABLE_SPEC_KERNELS"


def verify_op(
    target_logits: torch.Tensor,  # [B, n+1, V]
    draft_tokens: torch.Tensor,  # [B, n]
    sampling: SamplingBatch,
    noise: VerifyNoise,
    draft_probs: torch.Tensor | None = None,  # [B, n, V]; None = deterministic drafts
    num_drafts: torch.Tensor | None = None,  # [B]
    *,
    impl: str | None = None,
) -> VerifyResult:
    """portable_spec.core.verify.verify, fused on CUDA: filtering (target_probs) stays torch, the rest is one kernel."""
    if choose_impl(target_logits, impl, kernel="verify_triton") == "torch":
        return verify(target_logits, draft_tokens, sampling, noise, draft_probs, num_drafts)
    check_chain_shapes(target_logits, draft_tokens)
    p = target_probs(target_logits, sampling)
    return kernel_module("verify_triton").verify_probs(p, draft_tokens, noise, draft_probs, num_drafts)


def attention_reference(
    q: torch.Tensor,  # [B, H, k, d]
    context_k: torch.Tensor,  # [B, Hkv, T, d]
    context_v: torch.Tensor,  # [B, Hkv, T, d]
    block_k: torch.Tensor,  # [B, Hkv, k, d]
    block_v: torch.Tensor,  # [B, Hkv, k, d]
    context_valid: torch.Tensor,  # [B, T] bool
    block_causal: bool,
) -> torch.Tensor:  # [B, H, k, d]
    """The torch twin: the drafter's own attention math for one block per request."""
    mask = block_attention_mask(context_valid.to(torch.bool), q.shape[2], block_causal)
    return injected_attention(q, context_k, context_v, block_k, block_v, mask)


def attention_op(
    q: torch.Tensor,
    context_k: torch.Tensor,
    context_v: torch.Tensor,
    block_k: torch.Tensor,
    block_v: torch.Tensor,
    context_valid: torch.Tensor,
    block_causal: bool,
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """Drafter attention over [injected context; block] (shapes as attention_reference)."""
    _check_attention_shapes(q, context_k, context_v, block_k, block_v, context_valid)
    if choose_impl(q, impl, kernel="attention_triton") == "torch":
        return attention_reference(q, context_k, context_v, block_k, block_v, context_valid, block_causal)
    return kernel_module("attention_triton").injected_attention_triton(
        q, context_k, context_v, block_k, block_v, context_valid, block_causal
    )


def choose_impl(tensor: torch.Tensor, impl: str | None = None, *, kernel: str) -> str:
    """'torch' or 'triton' for the registered kernel on `tensor`: the argument, else the env var, else auto."""
    requested = impl or os.environ.get(ENV_VAR, "auto")
    if requested not in IMPLS:
        raise ValueError(f"kernel implementation {requested!r} (argument impl or ${ENV_VAR}): choose one of {IMPLS}")
    if requested == "auto":
        return "triton" if tensor.is_cuda and triton_available() else "torch"
    if requested == "triton":
        if not triton_available():
            raise RuntimeError(
                "impl='triton' was forced but triton does not import: pip install 'portable-spec[triton]'"
            )
        if not tensor.is_cuda and not kernel_module(kernel).INTERPRETED:
            raise RuntimeError(
                f"impl='triton' on {tensor.device} tensors needs a CUDA device, or TRITON_INTERPRET=1 set before "
                "triton is first imported (interpreter: correctness only); use impl='torch' on CPU"
            )
    return requested


@lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


KERNEL_GROUP = "portable_spec.kernels"


@lru_cache(maxsize=None)
def registered_kernels() -> dict[str, str]:
    """Kernel name -> module path, from the `portable_spec.kernels` entry-point group (pyproject.toml)."""
    return {entry.name: entry.value for entry in entry_points(group=KERNEL_GROUP)}


def kernel_module(name: str) -> ModuleType:
    """The registered kernel module `name`, imported on first use (it imports triton)."""
    module = registered_kernels().get(name)
    if module is None:
        raise RuntimeError(
            f"no kernel {name!r} in the {KERNEL_GROUP!r} entry-point group: reinstall portable-spec "
            "(pip install -e .) so its entry points are registered"
        )
    return importlib.import_module(module)


def _check_attention_shapes(q, context_k, context_v, block_k, block_v, context_valid) -> None:
    batch, heads, k, d = q.shape
    kv_heads, ctx_len = context_k.shape[1], context_k.shape[2]
    expected = {
        "context_k": (context_k, (batch, kv_heads, ctx_len, d)),
        "context_v": (context_v, (batch, kv_heads, ctx_len, d)),
        "block_k": (block_k, (batch, kv_heads, k, d)),
        "block_v": (block_v, (batch, kv_heads, k, d)),
        "context_valid": (context_valid, (batch, ctx_len)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {shape} (q is {tuple(q.shape)})")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q has {heads} heads, not a multiple of the {kv_heads} kv heads (GQA groups must be whole)")
