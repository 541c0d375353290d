"""portable-spec: depth-causal parallel drafting for speculative decoding, one checkpoint for every engine.

The public API, importable from here (lazily: `import portable_spec` loads no model code until a name is used):

    from portable_spec import SpeculativeDecoder, GenerationConfig, SamplingParams, TargetModel, load_drafter
    target = TargetModel.load("path/to/hf-model")
    decoder = SpeculativeDecoder(target, target.load_drafter("path/to/drafter"))
    out = decoder.generate([prompt_ids], GenerationConfig(max_new_tokens=64, num_draft_tokens=3))

Layers (docs/architecture.md): core <- kernels <- training, bench, adapters <- conformance <- cli.
"""

from __future__ import annotations

import importlib

PUBLIC = {
    "SpeculativeDecoder": "portable_spec.core.decode",
    "GenerationConfig": "portable_spec.core.decode",
    "GenerationOutput": "portable_spec.core.decode",
    "SamplingParams": "portable_spec.core.sampling",
    "TargetModel": "portable_spec.core.target",
    "Drafter": "portable_spec.core.drafter",
    "load_drafter": "portable_spec.core.drafter",
    "DrafterConfig": "portable_spec.core.spec",
    "SpecError": "portable_spec.core.spec",
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module 'portable_spec' has no attribute {name!r}")
    return getattr(importlib.import_module(PUBLIC[name]), name)
