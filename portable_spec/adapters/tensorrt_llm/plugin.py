"""Serve portable depth_causal drafters inside TensorRT-LLM's own decode loop (PyTorch backend, DFlash mode).

`register()` claims the DFLASH slot of TensorRT-LLM's draft-model builder registry
(`tensorrt_llm._torch.models.modeling_utils.register_draft_model`; external registrations win over built-ins).
The builder it installs builds `PortableDepthCausalDFlash` (TensorRT-LLM's `DFlashForCausalLM` plus
`DepthCausalDFlashMixin`) only for a checkpoint whose config.json says `portable_spec.variant: depth_causal`;
every other checkpoint goes to the builder that held the slot before (TensorRT-LLM's own), unchanged.
TensorRT-LLM's scheduler, KV cache, hidden-state capture, verification and sampling are its own.

How it is loaded: `trtllm-serve ... --custom_module_dirs OUT/portable_spec_trtllm` (written by
`portable-spec export trtllm`), or `from portable_spec.adapters.tensorrt_llm.plugin import register; register()`
before `LLM(...)`. Importing this module imports no TensorRT-LLM; `register()` does.
"""

from __future__ import annotations

from portable_spec.adapters.tensorrt_llm.depth_causal import DepthCausalDFlashMixin
from portable_spec.adapters.tensorrt_llm.export import installed_trtllm_version
from portable_spec.core.spec import SpecError
from portable_spec.core.variants import behaviour_of

REGISTRY = "tensorrt_llm._torch.models.modeling_utils.register_draft_model"
FALLBACK = (
    "fallback: `portable-spec export trtllm DRAFTER OUT --target TARGET --route onnx` (a TensorRT drafter "
    "engine driven by portable-spec's own loop)"
)
_registered = False


def portable_variant(pretrained_config) -> str | None:
    """The portable-spec variant a draft checkpoint's config.json declares, or None for any other checkpoint."""
    section = getattr(pretrained_config, "portable_spec", None)
    return section.get("variant") if isinstance(section, dict) else None


def needs_plugin(pretrained_config) -> bool:
    """A portable single-pass drafter TensorRT-LLM's own DFlash class would run wrongly (causal block, shift-mix)."""
    kind = portable_variant(pretrained_config)
    return kind is not None and behaviour_of(kind).dflash_shaped and not behaviour_of(kind).engine_native


def _trtllm_version(module) -> str:
    return str(getattr(module, "__version__", None) or installed_trtllm_version() or "unknown")


def _import_registry():
    """(register_draft_model, get_registered_draft_model_builder, DFLASH mode, DFlashForCausalLM) or a refusal
    naming the version found, what is needed and the fallback."""
    try:
        import tensorrt_llm
    except ImportError as error:
        raise SpecError(
            f"tensorrt_llm is not importable ({error}); install TensorRT-LLM on the GPU machine. {FALLBACK}"
        ) from None
    try:
        from tensorrt_llm._torch.models.modeling_dflash import DFlashForCausalLM
        from tensorrt_llm._torch.models.modeling_utils import get_registered_draft_model_builder, register_draft_model
        from tensorrt_llm._torch.speculative.interface import SpeculativeDecodingMode

        mode = SpeculativeDecodingMode.DFLASH
    except (ImportError, AttributeError) as error:
        raise SpecError(
            f"tensorrt_llm {_trtllm_version(tensorrt_llm)} has no draft-model builder registry for DFlash ({error}); depth_causal "
            f"inside TensorRT-LLM needs a release with {REGISTRY} and modeling_dflash.DFlashForCausalLM "
            f"(TensorRT-LLM >= 1.4 development line). {FALLBACK}"
        ) from None
    return register_draft_model, get_registered_draft_model_builder, mode, DFlashForCausalLM


def depth_causal_class(dflash_class: type) -> type:
    """TensorRT-LLM's DFlash drafter class with the depth_causal mixin; shift-mix lives where the draft runs."""

    class PortableDepthCausalDFlash(DepthCausalDFlashMixin, dflash_class):
        def __init__(self, draft_config, **kwargs):
            super().__init__(draft_config, **kwargs)
            weight = self.model.layers[0].input_layernorm.weight
            self.install_depth_causal(self.config.hidden_size, device=weight.device, dtype=weight.dtype)

    return PortableDepthCausalDFlash


def register() -> None:
    """Install the DFLASH builder (idempotent). Refuses, with the version, on a TensorRT-LLM without the registry."""
    global _registered
    if _registered:
        return
    register_draft_model, registered_builder, mode, dflash_class = _import_registry()
    previous = registered_builder(mode)  # imports TensorRT-LLM's own builder first, so ours is registered last
    depth_causal = depth_causal_class(dflash_class)

    @register_draft_model(mode)
    def build_portable_dflash_draft(model_config, draft_config, lm_head, model):
        if needs_plugin(draft_config.pretrained_config):
            return depth_causal(draft_config, dflash_attention_backend=model_config.spec_config.attention_backend)
        if previous is None:
            raise SpecError(
                "TensorRT-LLM registered no DFlash drafter builder of its own; this checkpoint is not a "
                "portable depth_causal one, so portable-spec cannot build it"
            )
        return previous(model_config, draft_config, lm_head, model)

    _registered = True
