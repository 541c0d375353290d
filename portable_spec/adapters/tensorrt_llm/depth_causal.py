"""depth_causal on TensorRT-LLM's DFlash drafter: the two things that differ from `parallel`, and nothing else.

TensorRT-LLM's `DFlashForCausalLM.dflash_forward` runs the draft block through its layers with a deferred
residual (`input_layernorm(hidden, residual)` adds, then normalises) and asks `_get_attention_mask_args(layer)`
whether block attention is causal. The core depth_causal drafter differs from DFlash in exactly two places:

* before every layer, slot j mixes in slot j-1 (core `ShiftMix`, `layers.{i}.shift_mix.weight` [H, 2H]) on the
  residual stream. Layer 0's stream is the block's input embedding, so it is mixed before `dflash_forward`
  runs; for layer i >= 1 the stream only exists inside the fused add+norm, so that norm's call is wrapped:
  add, mix, normalise, and hand the mixed stream on as the residual;
* block attention is causal: flash-attention's causal flag with a KV cache aligns the mask bottom-right, so
  slot j sees the whole context and slots <= j, as the core's `block_attention_mask(block_causal=True)`.

`DepthCausalDFlashMixin` carries both. It is pure torch and imports no TensorRT-LLM, so the same code runs on
TensorRT-LLM's class (`plugin.py`) and, in the test suite, on a CPU twin of that class's layer loop.
"""

from __future__ import annotations

import re
from functools import partial

import torch
from torch import nn

from portable_spec.core.drafter_layers import ShiftMix
from portable_spec.core.spec import SpecError

SHIFT_MIX_WEIGHT = re.compile(r"^layers\.(\d+)\.shift_mix\.weight$")  # the core drafter's names, exported as is


def split_shift_mix_weights(weights: dict, num_layers: int, source: str) -> tuple[dict, dict[int, torch.Tensor]]:
    """(weights without shift-mix, {layer: shift-mix weight}); every layer must have one, and no other may."""
    mixes = {int(m[1]): value for name, value in weights.items() if (m := SHIFT_MIX_WEIGHT.match(name))}
    if sorted(mixes) != list(range(num_layers)):
        raise SpecError(
            f"{source}: a depth_causal checkpoint needs layers.{{0..{num_layers - 1}}}.shift_mix.weight, found layers "
            f"{sorted(mixes)}; re-export it with `portable-spec export trtllm` from the portable checkpoint"
        )
    rest = {name: value for name, value in weights.items() if not SHIFT_MIX_WEIGHT.match(name)}
    return rest, mixes


def mix_block(shift_mix: ShiftMix, stream: torch.Tensor, block_len: int) -> torch.Tensor:
    """stream [B*k, H] or [B, k, H] (rows grouped by request, k slots each) -> same shape, shift-mixed per block."""
    hidden = stream.shape[-1]
    return shift_mix(stream.reshape(-1, 1, block_len, hidden)).reshape(stream.shape)


def shift_mixed_norm(
    norm_forward, shift_mix: ShiftMix, owner: "DepthCausalDFlashMixin", hidden_states: torch.Tensor, residual=...
):
    """A layer's input norm with the shift-mix inside: with a residual (TensorRT-LLM's fused add+norm), add in
    float32 as its torch path does, mix the sum, normalise it and return (normed, mixed) so the mixed stream is
    the residual from here on; without one, mix the input and normalise it."""
    if not isinstance(residual, torch.Tensor):
        return norm_forward(mix_block(shift_mix, hidden_states, owner.block_len))
    stream = (hidden_states.float() + residual.float()).to(residual.dtype)
    mixed = mix_block(shift_mix, stream, owner.block_len)
    return norm_forward(mixed), mixed


class DepthCausalDFlashMixin:
    """Mix in before a DFlash drafter class (TensorRT-LLM's `DFlashForCausalLM` or its CPU twin), then call
    `install_depth_causal()` at the end of `__init__`. Needs from the base: `self.model.layers[i].input_layernorm`,
    `dflash_forward(noise_embedding, ...)`, `_get_attention_mask_args(layer_idx)`, `load_weights(weights, ...)`."""

    block_len: int

    def install_depth_causal(self, hidden_size: int, device=None, dtype=None) -> None:
        layers = self.model.layers
        self.shift_mixes = nn.ModuleList(ShiftMix(hidden_size) for _ in layers).to(device=device, dtype=dtype)
        self.block_len = 0
        for index, layer in enumerate(layers):
            if index:  # layer 0's stream is the block input, mixed in dflash_forward
                norm = layer.input_layernorm
                # an instance-level forward keeps the module tree (and so every weight name) unchanged
                norm.forward = partial(shift_mixed_norm, norm.forward, self.shift_mixes[index], self)

    def _get_attention_mask_args(self, layer_idx):
        _, window = super()._get_attention_mask_args(layer_idx)
        return True, window

    def dflash_forward(self, noise_embedding: torch.Tensor, *args, **kwargs):
        """noise_embedding [B, k, H] ([anchor; MASK...] embedded): mixed for layer 0, then the base forward."""
        self.block_len = noise_embedding.shape[1]
        return super().dflash_forward(mix_block(self.shift_mixes[0], noise_embedding, self.block_len), *args, **kwargs)

    def load_weights(self, weights, *args, **kwargs):
        rest, mixes = split_shift_mix_weights(dict(weights), len(self.shift_mixes), "draft checkpoint")
        with torch.no_grad():
            for index, weight in mixes.items():
                target = self.shift_mixes[index].weight
                if weight.shape != target.shape:
                    raise SpecError(
                        f"draft checkpoint: layers.{index}.shift_mix.weight has shape "
                        f"{tuple(weight.shape)}, expected {tuple(target.shape)} (2 x hidden_size)"
                    )
                target.copy_(weight.to(target.device, target.dtype))
        return super().load_weights(rest, *args, **kwargs)
