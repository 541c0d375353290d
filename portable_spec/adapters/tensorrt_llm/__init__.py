"""TensorRT-LLM adapter: export for its build/load step, and depth_causal inside its own decode loop.

`export` writes what TensorRT-LLM consumes per version and variant (the `dflash` route: a DFlash checkpoint +
`DFlashDecodingConfig`; the `onnx` route: a TensorRT drafter graph). `depth_causal` is the pure-torch mixin that
turns TensorRT-LLM's DFlash drafter into the depth_causal one; `plugin.register` installs it through TensorRT-LLM's
draft-model builder registry. Importing this package imports no TensorRT-LLM.
"""

from portable_spec.adapters.tensorrt_llm.export import (
    DFLASH_MIN_VERSION,
    DRAFT_DIR,
    IN_LOOP_MIN_VERSION,
    LLM_API_OPTIONS_FILE,
    MANIFEST_FILE,
    MODULE_DIR,
    DFlashSpeculativeConfig,
    ExportRequest,
    dflash_weights,
    export_for_trtllm,
    export_trtllm,
    installed_trtllm_version,
    parse_version,
    validate_speculative_config,
)

__all__ = [
    "DFLASH_MIN_VERSION",
    "DRAFT_DIR",
    "IN_LOOP_MIN_VERSION",
    "LLM_API_OPTIONS_FILE",
    "MANIFEST_FILE",
    "MODULE_DIR",
    "DFlashSpeculativeConfig",
    "ExportRequest",
    "dflash_weights",
    "export_for_trtllm",
    "export_trtllm",
    "installed_trtllm_version",
    "parse_version",
    "validate_speculative_config",
]
