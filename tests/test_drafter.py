"""Drafter semantics: the variant switch changes exactly the block attention and the shift-mix."""

import pytest
import torch

from portable_spec.core.drafter import Drafter
from portable_spec.core.testing import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _block_logits(drafter, block_ids, context_len=6):
    torch.manual_seed(5)
    features = torch.randn(1, context_len, drafter.config.feature_size)
    positions = torch.arange(context_len)[None]
    context = drafter.context_kv(features, positions)
    k = block_ids.shape[-1]
    block_positions = context_len + torch.arange(k)[None, None]
    mask = torch.ones(1, k, context_len, dtype=torch.bool)
    with torch.no_grad():
        return drafter.block_logits(block_ids, block_positions, context, mask)


@pytest.mark.parametrize("kind,causal", [("parallel", False), ("depth_causal", True), ("autoregressive", True)])
def test_later_slots_influence_earlier_ones_only_in_parallel(target, kind, causal):
    drafter = tiny_drafter(target, kind, block_size=6)
    ids = torch.tensor([[[3, 9, 9, 9, 9, 9]]])
    changed = ids.clone()
    changed[0, 0, 4] = 17
    a, b = _block_logits(drafter, ids), _block_logits(drafter, changed)
    assert torch.equal(a[..., :4, :], b[..., :4, :]) == causal
    assert not torch.equal(a[..., 4:, :], b[..., 4:, :])


def test_shift_mix_starts_as_identity(target):
    """What the initialiser itself builds (a freshly constructed drafter, no weights loaded or written)."""
    fresh = target.bind(Drafter(tiny_drafter(target, "depth_causal").config))
    h = torch.randn(2, 3, 5, 64)
    for layer in fresh.layers:
        assert torch.equal(layer.shift_mix(h), h)


def test_shift_mix_moves_information_one_slot_per_layer(target):
    drafter = tiny_drafter(target, "depth_causal")
    h = torch.zeros(1, 1, 4, 64)
    h[0, 0, 0] = 1.0
    mixed = drafter.layers[0].shift_mix(h)
    assert mixed[0, 0, 1].abs().sum() > 0 and mixed[0, 0, 2:].abs().sum() == 0


def test_invalid_context_slots_are_invisible(target):
    drafter = tiny_drafter(target, "depth_causal")
    features = torch.randn(1, 5, drafter.config.feature_size)
    positions = torch.arange(5)[None]
    valid = torch.tensor([[True, False, True, True, False]])
    noisy = features.clone()
    noisy[0, [1, 4]] = 100.0
    anchor, anchor_pos = torch.tensor([3]), torch.tensor([5])
    a = drafter.propose(drafter.context_kv(features, positions), valid, anchor, anchor_pos, 7)
    b = drafter.propose(drafter.context_kv(noisy, positions), valid, anchor, anchor_pos, 7)
    assert torch.equal(a, b)


def test_autoregressive_propose_feeds_back_its_drafts(target):
    drafter = tiny_drafter(target, "autoregressive")
    features = torch.randn(1, 4, drafter.config.feature_size)
    positions, valid = torch.arange(4)[None], torch.ones(1, 4, dtype=torch.bool)
    context = drafter.context_kv(features, positions)
    drafts = drafter.propose(context, valid, torch.tensor([5]), torch.tensor([4]), 3)
    tokens = torch.tensor([[[5]]])
    for _ in range(3):  # one pass per token, by hand
        k = tokens.shape[-1]
        logits = drafter.block_logits(
            tokens, 4 + torch.arange(k)[None, None], context, valid[:, None].expand(-1, k, -1)
        )
        tokens = torch.cat((tokens, logits[:, :, -1:].argmax(-1)), dim=-1)
    assert torch.equal(drafts, tokens[0, :, 1:])


def test_shift_mix_on_engine_rows_equals_the_block_layout():
    """Engines hand the drafter rows [N, H] (each request's block contiguous, padding after the last block):
    mix_rows is the block-layout ShiftMix on them, and padding rows never reach a real block."""
    from portable_spec.core.drafter_layers import ShiftMix

    torch.manual_seed(0)
    mix = ShiftMix(8)
    mix.weight.data.normal_()
    blocks = torch.randn(3, 1, 4, 8)
    rows = torch.cat((blocks.reshape(12, 8), torch.randn(2, 8)))  # two padding rows
    mixed = mix.mix_rows(rows, 4)
    assert mixed.shape == (14, 8)
    assert torch.allclose(mixed[:12], mix(blocks).reshape(12, 8))
