"""SGLang adapter: portable-spec drafters served by SGLang's own DFLASH algorithm (docs/backends/sglang.md).

parallel drafters load as SGLang's native DFlashDraftModel; depth_causal ones as draft_model.DepthCausalDraftModel,
registered under DepthCausalVariant.engine_architecture by the `sglang.srt.plugins` entry point (plugin.py).
Importing this package imports no SGLang: only validate.py's SGLang-free checks are re-exported here.
"""

from portable_spec.adapters.sglang.validate import (
    ALGORITHM,
    DEPTH_CAUSAL_ARCHITECTURE,
    SUPPORTED_SGLANG_VERSIONS,
    check_served_target,
    check_sglang_version,
    check_speculative_options,
    portable_config_of,
)

__all__ = [
    "ALGORITHM",
    "DEPTH_CAUSAL_ARCHITECTURE",
    "SUPPORTED_SGLANG_VERSIONS",
    "check_served_target",
    "check_sglang_version",
    "check_speculative_options",
    "portable_config_of",
]
