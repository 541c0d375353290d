"""Training: the loss falls on a learnable signal, checkpoints load, and resuming equals not stopping."""

import torch
from fixture_training import train_drafter

from portable_spec.core.drafter import load_drafter
from portable_spec.core.target import drafter_config_for
from portable_spec.core.testing import tiny_target
from portable_spec.training.config import TrainConfig


def _setup(kind="depth_causal"):
    target = tiny_target()
    config = drafter_config_for(
        target, kind=kind, block_size=4, num_hidden_layers=1, target_layer_ids=[0, 1], mask_token_id=255
    )
    stream = torch.arange(4000) % 37  # a periodic corpus: perfectly predictable from context
    return target, config, stream


def test_resume_reproduces_uninterrupted_training(tmp_path):
    target, config, stream = _setup()
    train = dict(steps=4, batch_size=2, seq_len=32, anchors_per_seq=3, save_every=2, warmup_steps=1)
    straight = train_drafter(target, config, stream, TrainConfig(**train), tmp_path / "a", progress=False)
    train_drafter(
        target,
        config,
        stream,
        TrainConfig(**{**train, "steps": 2}),
        tmp_path / "tmp",
        state_dir=tmp_path / "state",
        progress=False,
    )  # "interrupted" after step 2
    resumed = train_drafter(
        target, config, stream, TrainConfig(**train), tmp_path / "b", state_dir=tmp_path / "state", progress=False
    )
    for name, tensor in straight.state_dict().items():
        assert torch.allclose(resumed.state_dict()[name], tensor, atol=1e-6), name
    assert load_drafter(tmp_path / "b").config == config


def test_loss_falls_on_predictable_text(tmp_path):
    from portable_spec.training.loss import drafter_loss

    target, config, stream = _setup("parallel")
    tokens = stream[:64].view(2, 32)
    anchors = torch.tensor([[3, 10, 20], [5, 12, 25]])
    untrained = train_drafter(
        target, config, stream, TrainConfig(steps=1, lr=1e-9, warmup_steps=0), tmp_path / "u", progress=False
    )
    trained = train_drafter(
        target,
        config,
        stream,
        TrainConfig(steps=60, batch_size=4, seq_len=32, anchors_per_seq=4, lr=1e-2, warmup_steps=2),
        tmp_path / "t",
        progress=False,
    )
    positions = torch.arange(32).expand(2, -1)
    with torch.no_grad():
        _, features = target.forward(
            tokens, positions, torch.ones_like(tokens, dtype=torch.bool), target.new_cache(), config.target_layer_ids
        )
        before = drafter_loss(untrained, features, tokens, anchors, 7.0).item()
        after = drafter_loss(trained, features, tokens, anchors, 7.0).item()
    assert after < 0.9 * before  # untrained ~ln(V); a broken gradient path would stay there
