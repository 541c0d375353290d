"""The depth_causal drafter inside SGLang: SGLang's DFlash draft model plus the core ShiftMix before every layer.

Everything else is SGLang's DFlash, unchanged: the context path (fc -> hidden_norm -> per-layer K/V written by
DFlashWorkerV2), the layers and the final norm. Causal block attention needs no code: config.json carries
`is_causal: true` and `layer_types`, which makes SGLang build DECODER (causal) draft attention.
The parallel variant needs nothing here: its architecture is SGLang's own DFlashDraftModel.
Imports SGLang: load this module only through the plugin (after the version check) or a test.
"""

from __future__ import annotations

import torch
from sglang.srt.models.dflash import DFlashDecoderLayer, DFlashDraftModel

from portable_spec.adapters.sglang.validate import DEPTH_CAUSAL_ARCHITECTURE
from portable_spec.core.drafter_layers import ShiftMix
from portable_spec.core.spec import SpecError


class DepthCausalDecoderLayer(DFlashDecoderLayer):
    """h_j <- W [h_j ; h_{j-1}] on the residual stream, then SGLang's DFlash layer. Weight name
    `layers.{i}.shift_mix.weight` [H, 2H], loaded by the inherited DFlash load_weights."""

    def __init__(self, config, layer_id: int, *args, **kwargs) -> None:
        super().__init__(config, layer_id, *args, **kwargs)
        self.shift_mix = ShiftMix(int(config.hidden_size))
        self.block_size = 0  # set by DepthCausalDraftModel.set_block_size (config, then the worker's)

    def forward(self, positions, hidden_states, forward_batch, residual: torch.Tensor | None):
        """Rows are the draft blocks laid out [bs * block_size, H] (SGLang's TARGET_VERIFY draft batch)."""
        if hidden_states.numel() == 0:
            return super().forward(positions, hidden_states, forward_batch, residual)
        stream = hidden_states if residual is None else hidden_states + residual  # DFlash fuses add+norm lazily
        rows = stream.shape[0]
        if rows % self.block_size:
            raise SpecError(
                f"depth_causal draft batch has {rows} rows, not a multiple of block_size={self.block_size}; "
                "SGLang laid the draft blocks out differently than DFlashWorkerV2 of sglang 0.5.23 does"
            )
        return super().forward(positions, self.shift_mix.mix_rows(stream, self.block_size), forward_batch, None)


class DepthCausalDraftModel(DFlashDraftModel):
    """Registered in SGLang's ModelRegistry under DepthCausalVariant.engine_architecture, the name every
    depth_causal config.json carries (SGLang resolves by that key, not by the class name)."""

    decoder_layer_cls = DepthCausalDecoderLayer

    def __init__(self, config, quant_config=None, prefix: str = "") -> None:
        super().__init__(config, quant_config=quant_config, prefix=prefix)
        self.set_block_size(self.block_size)  # block_size from config.json until the worker resolves its own

    def set_block_size(self, block_size: int) -> None:
        super().set_block_size(block_size)
        for layer in self.layers:
            layer.block_size = int(block_size)


def register_architecture() -> None:
    """Add the architecture to SGLang's ModelRegistry (idempotent); refuse to shadow another class of that name."""
    from sglang.srt.models.registry import ModelRegistry

    current = ModelRegistry.models.get(DEPTH_CAUSAL_ARCHITECTURE)
    if current is not None and current is not DepthCausalDraftModel:
        raise SpecError(
            f"SGLang's ModelRegistry already maps {DEPTH_CAUSAL_ARCHITECTURE!r} to {current!r}; another package "
            "registers the same architecture. fix: uninstall it (pip list | grep -i spec) or set "
            "SGLANG_PLUGINS=portable_spec"
        )
    ModelRegistry.models[DEPTH_CAUSAL_ARCHITECTURE] = DepthCausalDraftModel
