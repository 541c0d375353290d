"""The layer-id convention: feature block j is the OUTPUT of target layer target_layer_ids[j]."""

import torch

from portable_spec.core.testing import tiny_target


def test_features_are_outputs_of_the_named_layers():
    target = tiny_target()
    captured = {}
    hooks = [
        layer.register_forward_hook(
            lambda m, i, o, idx=idx: captured.__setitem__(idx, o[0] if isinstance(o, tuple) else o)
        )
        for idx, layer in enumerate(target.model.model.layers)
    ]
    ids = torch.randint(0, 256, (2, 7))
    positions = torch.arange(7).expand(2, -1)
    _, features = target.forward(ids, positions, torch.ones(2, 7, dtype=torch.bool), target.new_cache(), [0, 1])
    for hook in hooks:
        hook.remove()
    hidden = target.config.hidden_size
    assert torch.allclose(features[..., :hidden], captured[0], atol=1e-6)
    assert torch.allclose(features[..., hidden:], captured[1], atol=1e-6)


def test_cache_with_holes_matches_a_clean_sequence():
    """Masked (rejected) slots inside the cache change nothing for later tokens."""
    target = tiny_target()
    seq = torch.tensor([[5, 6, 7, 8, 9]])
    clean_cache = target.new_cache()
    clean, _ = target.forward(seq, torch.arange(5)[None], torch.ones(1, 5, dtype=torch.bool), clean_cache)
    cache = target.new_cache()
    target.forward(seq[:, :3], torch.arange(3)[None], torch.ones(1, 3, dtype=torch.bool), cache)
    junk = torch.tensor([[100, 101]])  # two rejected slots at positions 3, 4
    target.forward(junk, torch.tensor([[3, 4]]), torch.ones(1, 5, dtype=torch.bool), cache)
    valid = torch.tensor([[True, True, True, False, False, True, True]])
    logits, _ = target.forward(seq[:, 3:], torch.tensor([[3, 4]]), valid, cache)
    assert torch.allclose(logits, clean[:, 3:], atol=1e-5)
