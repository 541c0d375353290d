"""The decode-shaped CPU layout (portable_spec/core/decode_matmul.py) computes what nn.Linear computes, only on the
shapes it claims, and leaves every layer as it found it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.decode_matmul import MAX_ROWS, DecodeShapedLinear, decode_shaped_linears
from portable_spec.core.testing import tiny_drafter, tiny_target


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 9, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_same_values_as_nn_linear(rows, bias):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 80, bias=bias)
    x = torch.randn(1, rows, 48)
    expected = layer(x)
    with torch.no_grad(), decode_shaped_linears(layer):
        assert type(layer) is DecodeShapedLinear
        got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if rows == 1 or rows > MAX_ROWS:  # outside its window it is exactly torch's own layer
        assert torch.equal(got, expected)


def test_layers_are_restored_even_after_an_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(RuntimeError, match="boom"), decode_shaped_linears(model):
        assert all(type(m) is DecodeShapedLinear for m in model if isinstance(m, nn.Linear))
        raise RuntimeError("boom")
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]


def test_training_keeps_torch_layout():
    """With autograd on (training), the layer is torch's own, so gradients are exactly torch's."""
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with decode_shaped_linears(layer):
        assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("kind", ["parallel", "depth_causal", "autoregressive"])
def test_greedy_output_same_with_and_without(kind):
    target = tiny_target()
    drafter = tiny_drafter(target, kind)
    config = GenerationConfig(max_new_tokens=12, num_draft_tokens=3)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    plain = SpeculativeDecoder(target, decode_matmul=False).generate(prompts, config).tokens
    for decode_matmul in (False, True):
        assert (
            SpeculativeDecoder(target, drafter, decode_matmul=decode_matmul).generate(prompts, config).tokens == plain
        )
    assert all(type(m) is not DecodeShapedLinear for m in list(target.model.modules()) + list(drafter.modules()))
