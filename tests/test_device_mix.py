"""Decode, verify, noise, sampling, drafter, proposer, feature batches and the training forward run with every tensor
on the model's device: under fake `cuda` (tests/fake_cuda.py) a tensor built on the CPU and mixed in fails, as
it would on a GPU. Outputs must equal the CPU run's, so the fake device changes placement, never values."""

from __future__ import annotations

import pytest
import torch
from fake_cuda import DeviceMismatch, FakeCudaTensor, fake_cuda
from fixture_training import stream_batches, train_drafter

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, SamplingParams
from portable_spec.core.target import drafter_config_for
from portable_spec.core.testing import tiny_drafter, tiny_target
from portable_spec.core.verify import verify
from portable_spec.training.config import TrainConfig
from portable_spec.training.features import FeatureDataset
from portable_spec.training.loss import drafter_loss
from portable_spec.training.replies import Sequences
from portable_spec.training.state import initial_drafter

PROMPTS = [[5, 9, 14, 3, 22, 7], [40, 41, 42]]


@pytest.fixture(autouse=True)
def _torch_kernels(monkeypatch):
    """The torch twins: the Triton path on (fake) CUDA would need a GPU driver (its own tests: test_kernels.py)."""
    monkeypatch.setenv("PORTABLE_SPEC_KERNELS", "torch")


def test_the_guard_catches_a_cpu_tensor_mixed_into_cuda_math():
    """The check itself: the placeholder noise that crashed greedy decoding on CUDA (built with no device=) fails."""
    logits = torch.randn(2, 3, 16)
    drafts = logits[:, :2].argmax(-1)
    with fake_cuda():
        on_cuda = logits.to("cuda")
        assert on_cuda.device.type == "cuda" and isinstance(on_cuda, FakeCudaTensor)
        sampling = SamplingBatch.from_params([SamplingParams()] * 2, "cuda")
        cpu_noise = VerifyNoise(accept_uniform=torch.full((2, 2), 0.5), sample_uniform=torch.full((2, 3, 16), 0.5))
        with pytest.raises(DeviceMismatch, match="cpu"):
            verify(on_cuda, drafts.to("cuda"), sampling, cpu_noise)
        result = verify(on_cuda, drafts.to("cuda"), sampling, VerifyNoise.unused(2, 2, 16, "cuda"))
        assert result.next_token.device.type == "cuda"
        assert result.next_token.tolist() == logits[torch.arange(2), result.accepted_len.tolist()].argmax(-1).tolist()


@pytest.mark.parametrize("kind", ["depth_causal", "parallel", "autoregressive"])
@pytest.mark.parametrize(
    "settings",
    [
        {},  # greedy: the round that crashed on CUDA
        {"sampling": SamplingParams(temperature=0.8, top_k=20, top_p=0.9), "seed": 3},
        {"draft_confidence": 0.2},
    ],
)
def test_decode_loop_on_cuda_equals_cpu(kind, settings):
    target = tiny_target()
    drafter = tiny_drafter(target, kind, block_size=4)
    config = GenerationConfig(max_new_tokens=10, num_draft_tokens=3, **settings)
    on_cpu = SpeculativeDecoder(target, drafter).generate(PROMPTS, config)
    with fake_cuda():
        target.model.to("cuda")
        drafter.to("cuda")
        assert target.device.type == "cuda" and next(drafter.parameters()).device.type == "cuda"
        on_cuda = SpeculativeDecoder(target, drafter).generate(PROMPTS, config)
    assert on_cuda.tokens == on_cpu.tokens
    assert on_cuda.stats.emitted_per_round == on_cpu.stats.emitted_per_round


def test_plain_decoding_on_cuda_equals_cpu():
    target = tiny_target()
    config = GenerationConfig(max_new_tokens=8)
    on_cpu = SpeculativeDecoder(target).generate(PROMPTS, config).tokens
    with fake_cuda():
        target.model.to("cuda")
        assert SpeculativeDecoder(target).generate(PROMPTS, config).tokens == on_cpu


def _dataset() -> FeatureDataset:
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 200, (n,), generator=generator).tolist() for n in (4, 9, 6)]
    replies = [torch.randint(0, 200, (n,), generator=generator).tolist() for n in (30, 12, 45)]
    sequences = Sequences.from_lists(prompts, replies)
    features = torch.randn(len(sequences.tokens), 128, generator=generator).to(torch.bfloat16)
    return FeatureDataset(sequences, features)


def test_feature_batches_are_drawn_on_the_device_and_equal_cpu():
    dataset = _dataset()
    on_cpu = dataset.batch([2, 0, 1, 2], 4, 3, 40, torch.Generator().manual_seed(5))
    with fake_cuda():
        on_cuda = dataset.to("cuda").batch([2, 0, 1, 2], 4, 3, 40, torch.Generator().manual_seed(5))
        assert all(t.device.type == "cuda" for t in on_cuda)
        on_cuda = [t.cpu() for t in on_cuda]
    for cpu, cuda in zip(on_cpu, on_cuda):
        assert torch.equal(cpu, cuda)


@pytest.mark.parametrize("draft_vocab_size", [None, 64])
def test_training_forward_on_cuda_equals_cpu(draft_vocab_size):
    """The drafter built by training sits on the target's device and its loss reads batches drawn there.
    (Backward cannot run on fake CUDA, see tests/fake_cuda.py; it is the same graph reversed.)"""
    target = tiny_target()
    config = drafter_config_for(
        target,
        kind="depth_causal",
        block_size=4,
        num_hidden_layers=1,
        target_layer_ids=[0, 1],
        mask_token_id=255,
        draft_vocab_size=draft_vocab_size,
    )
    vocab = torch.arange(0, 256, 4) if draft_vocab_size else None
    train = TrainConfig(batch_size=2, seq_len=24, anchors_per_seq=3)
    draw = stream_batches(target, torch.arange(500) % 37, train, config.target_layer_ids, config.block_size)
    with torch.no_grad():
        tokens, features, anchors = draw(1)
        loss_cpu = drafter_loss(initial_drafter(target, config, 0, vocab), features, tokens, anchors, 7.0)
        with fake_cuda():
            target.model.to("cuda")
            drafter = initial_drafter(target, config, 0, vocab)
            assert {p.device.type for p in drafter.parameters()} == {"cuda"}
            tokens, features, anchors = draw(1)
            assert {tokens.device.type, features.device.type, anchors.device.type} == {"cuda"}
            loss_cuda = float(drafter_loss(drafter, features, tokens, anchors, 7.0))
    assert loss_cuda == pytest.approx(float(loss_cpu), rel=1e-6)


def test_time_budget_ends_the_run_on_time_and_writes_the_checkpoint(tmp_path):
    target = tiny_target()
    config = drafter_config_for(
        target, kind="parallel", block_size=4, num_hidden_layers=1, target_layer_ids=[0, 1], mask_token_id=255
    )
    logged: list[tuple[int, float]] = []
    budget = 1.5
    train = TrainConfig(
        steps=10**6, batch_size=2, seq_len=32, anchors_per_seq=3, warmup_steps=1, time_budget=budget, save_every=10**6
    )
    from portable_spec.training.loop import train_loop

    draw = stream_batches(target, torch.arange(4000) % 37, train, config.target_layer_ids, config.block_size)
    train_loop(
        target,
        config,
        draw,
        train,
        tmp_path / "out",
        tmp_path / "state",
        progress=False,
        log=lambda step, loss, seconds: logged.append((step, seconds)),
    )
    # at least one step, far fewer than asked (how many fit in the budget depends on the machine's speed and load:
    # issue 46 saw 3 on a loaded machine, so the count is not asserted)
    assert 1 <= len(logged) < 10**6 and (tmp_path / "out" / "model.safetensors").exists()
    # it stops at the first step boundary past the budget, however slow a step is on a loaded machine
    assert all(seconds < budget for _, seconds in logged[:-1])
    import json

    state = json.loads((tmp_path / "state" / "trainer_state.json").read_text())
    assert state["step"] == len(logged) and state["elapsed_seconds"] >= budget
    # the saved seconds carry over a resume: the same budget is already spent (no step more), a longer one trains on
    train_drafter(target, config, torch.arange(4000) % 37, train, tmp_path / "same", tmp_path / "state", progress=False)
    assert json.loads((tmp_path / "state" / "trainer_state.json").read_text())["step"] == state["step"]
    longer = train.model_copy(update={"time_budget": budget + 0.5})
    train_drafter(
        target, config, torch.arange(4000) % 37, longer, tmp_path / "out2", tmp_path / "state", progress=False
    )
    resumed = json.loads((tmp_path / "state" / "trainer_state.json").read_text())
    assert resumed["step"] > state["step"] and resumed["elapsed_seconds"] >= budget + 0.5
