"""Reduced draft vocabulary (EAGLE-3 d2t layout): cheaper drafter head, same lossless output."""

import pytest
import torch

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.drafter import Drafter, load_drafter
from portable_spec.core.spec import SpecError
from portable_spec.core.target import drafter_config_for
from portable_spec.core.testing import tiny_target
from portable_spec.training.loss import drafter_loss, target_to_draft

VOCAB_IDS = torch.tensor(sorted({*range(0, 256, 3), 255}))  # 87 of 256 ids, including the mask id


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


def _drafter(target, kind="depth_causal", ids=VOCAB_IDS):
    config = drafter_config_for(
        target,
        kind=kind,
        block_size=6,
        num_hidden_layers=2,
        target_layer_ids=[0, 1],
        mask_token_id=255,
        draft_vocab_size=len(ids),
    )
    torch.manual_seed(3)
    drafter = target.bind(Drafter(config))
    drafter.set_draft_vocab(ids)
    return drafter.eval()


def test_logits_live_only_on_the_draft_vocabulary(target):
    drafter = _drafter(target)
    features = torch.randn(1, 5, drafter.config.feature_size)
    context = drafter.context_kv(features, torch.arange(5)[None])
    block = torch.full((1, 1, 6), 255)
    block[..., 0] = 7
    logits = drafter.block_logits(
        block, 5 + torch.arange(6)[None, None], context, torch.ones(1, 6, 5, dtype=torch.bool)
    )
    outside = torch.ones(256, dtype=torch.bool)
    outside[VOCAB_IDS] = False
    assert torch.isinf(logits[..., outside]).all() and torch.isfinite(logits[..., VOCAB_IDS]).all()
    full_head = target.shared_modules().lm_head(
        drafter.block_hidden(block, 5 + torch.arange(6)[None, None], context, torch.ones(1, 6, 5, dtype=torch.bool))
    )
    torch.testing.assert_close(logits[..., VOCAB_IDS], full_head[..., VOCAB_IDS])  # the same rows, sliced


def test_d2t_round_trips_through_the_checkpoint(target, tmp_path):
    drafter = _drafter(target)
    drafter.save(tmp_path / "d")
    loaded = target.bind(load_drafter(tmp_path / "d"))
    assert torch.equal(loaded.draft_token_ids(), VOCAB_IDS)
    assert loaded.config.draft_vocab_size == len(VOCAB_IDS)


def test_bad_draft_vocabulary_is_refused(target):
    drafter = _drafter(target)
    with pytest.raises(SpecError, match="distinct ids"):
        drafter.set_draft_vocab(torch.zeros(len(VOCAB_IDS), dtype=torch.int64))
    with pytest.raises(SpecError, match="draft_vocab_size"):
        drafter_config_for(
            target,
            kind="parallel",
            block_size=4,
            num_hidden_layers=1,
            target_layer_ids=[0],
            mask_token_id=255,
            draft_vocab_size=999,
        )


def test_tokens_outside_the_draft_vocabulary_carry_no_loss(target):
    drafter = _drafter(target)
    labels = torch.tensor([0, 1, 3, 4, 255])
    assert target_to_draft(drafter, labels).tolist() == [0, -100, 1, -100, len(VOCAB_IDS) - 1]
    tokens = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(24).expand(2, -1)
    _, features = target.forward(
        tokens, positions, torch.ones_like(tokens, dtype=torch.bool), target.new_cache(), [0, 1]
    )
    loss = drafter_loss(drafter, features, tokens, torch.tensor([[2, 9], [4, 12]]), 7.0)
    assert torch.isfinite(loss) and loss > 0


@pytest.mark.parametrize("kind", ["parallel", "depth_causal", "autoregressive"])
def test_greedy_output_is_unchanged_with_a_draft_vocabulary(target, kind):
    prompts = [torch.randint(0, 255, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 13)]
    config = GenerationConfig(max_new_tokens=20, num_draft_tokens=5)
    plain = SpeculativeDecoder(target).generate(prompts, config).tokens
    drafter = _drafter(target, kind)
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == plain
    context = drafter.context_kv(torch.randn(2, 4, drafter.config.feature_size), torch.arange(4).expand(2, -1))
    drafts = drafter.propose(context, torch.ones(2, 4, dtype=torch.bool), torch.tensor([7, 8]), torch.tensor([4, 4]), 5)
    assert set(drafts.flatten().tolist()) <= set(VOCAB_IDS.tolist())  # proposed ids are target ids in the draft vocab


def test_onnx_graph_of_a_reduced_vocabulary_drafter_matches_the_reference(tmp_path):
    pytest.importorskip("onnxruntime")
    from portable_spec.adapters.onnx import OnnxBackend
    from portable_spec.adapters.onnx_export import export_onnx
    from portable_spec.core.backends import ReferenceBackend

    target = tiny_target(0)
    target.model.save_pretrained(tmp_path / "target")
    _drafter(target).save(tmp_path / "drafter")
    graph = export_onnx(tmp_path / "drafter", tmp_path / "target", tmp_path / "graph")
    generator = torch.Generator().manual_seed(0)
    inputs = (
        torch.randn(2, 7, 128, generator=generator),
        torch.arange(7).expand(2, -1).clone(),
        torch.ones(2, 7, dtype=torch.bool),
        torch.randint(0, 256, (2, 1, 6), generator=generator),
        (7 + torch.arange(6)).expand(2, 1, 6).clone(),
    )
    expected = ReferenceBackend().block_logits(tmp_path / "target", tmp_path / "drafter", *inputs)
    actual = OnnxBackend().block_logits(tmp_path / "target", graph, *inputs)
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))
    assert (actual[..., VOCAB_IDS] - expected[..., VOCAB_IDS]).abs().max().item() <= 1e-4


def test_sglang_refuses_a_reduced_vocabulary_in_one_line(target):
    """SGLang's DFLASH worker expects the drafter's own draft-vocabulary head; vLLM's adapter fills one
    (tests/engines/test_vllm_adapter.py runs such a drafter through vLLM)."""
    from portable_spec.adapters.sglang import validate

    with pytest.raises(SpecError, match=f"draft_vocab_size={len(VOCAB_IDS)}: SGLang.*--draft-vocab-size 0"):
        validate.check_servable(_drafter(target, "depth_causal").config, "ckpt")


def test_vllm_accepts_a_reduced_vocabulary(target):
    from portable_spec.adapters.vllm import validate

    validate.check_servable(_drafter(target, "depth_causal").config, "ckpt")  # no refusal
