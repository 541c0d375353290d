"""Drafters narrower than their target (hidden_size < target.hidden_size): they carry their own embedding and LM
head (`own_embeddings`), the target's features enter through fc at the target's width. The spec's rule, the
checkpoint's weights, lossless decoding, the ONNX graph against the reference."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import SpecError, parse_config
from portable_spec.core.target import drafter_config_for
from portable_spec.core.testing import tiny_drafter, tiny_target

NARROW = 48  # the tiny target is 64 wide


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _narrow(target, kind="depth_causal", draft_vocab=None):
    drafter = tiny_drafter(target, kind, block_size=4, hidden_size=NARROW, draft_vocab_size=draft_vocab)
    if draft_vocab is not None:
        drafter.set_draft_vocab(torch.arange(draft_vocab) * 2)
    return drafter


def test_spec_rule_and_engine_keys(target):
    config = _narrow(target).config
    assert config.own_embeddings and config.hidden_size == NARROW
    data = config.to_json_dict()
    # vLLM sizes its fc input from target_hidden_size x the number of target layers
    assert data["target_hidden_size"] == 64 and config.feature_size == 2 * 64
    assert parse_config(data) == config
    with pytest.raises(SpecError, match=r"hidden_size=48 differs from target.hidden_size=64 but own_embeddings"):
        parse_config({**data, "own_embeddings": False})
    with pytest.raises(SpecError, match="target_hidden_size = 32 contradicts"):
        parse_config({**data, "target_hidden_size": 32})
    same_width = drafter_config_for(
        target, kind="parallel", block_size=4, num_hidden_layers=1, target_layer_ids=[0, 1], mask_token_id=255
    )
    assert not same_width.own_embeddings  # the default: embed and score with the target's


@pytest.mark.parametrize("draft_vocab", [None, 100])
def test_weights_are_the_drafters_own(tmp_path, target, draft_vocab):
    """The checkpoint holds embed_tokens [V, H] and lm_head [scored vocab, H]; the logits come from that head (a
    zeroed own head gives zero logits wherever the drafter scores), never from the target's."""
    drafter = _narrow(target, draft_vocab=draft_vocab)
    out = drafter.save(tmp_path / "drafter")
    weights = load_file(str(out / "model.safetensors"))
    assert tuple(weights["embed_tokens.weight"].shape) == (256, NARROW)
    assert tuple(weights["lm_head.weight"].shape) == (draft_vocab or 256, NARROW)
    loaded = target.load_drafter(out)
    context = loaded.context_kv(torch.randn(1, 6, loaded.config.feature_size), torch.arange(6)[None])
    block = torch.tensor([[[5, 255, 255, 255]]])

    def logits():
        with torch.no_grad():
            return loaded.block_logits(block, 6 + torch.arange(4)[None, None], context, torch.ones(1, 6, dtype=bool))

    before = logits()
    assert torch.isfinite(before).sum().item() == 4 * (draft_vocab or 256)
    with torch.no_grad():
        loaded.lm_head.weight.zero_()
    after = logits()
    assert after[torch.isfinite(after)].abs().max().item() == 0.0
    if draft_vocab is not None:  # -inf outside the draft vocabulary, as for a shared head
        assert torch.equal(torch.isfinite(after[0, 0, 0]).nonzero()[:, 0], torch.arange(draft_vocab) * 2)
    del weights["lm_head.weight"]
    save_file(weights, str(out / "model.safetensors"))
    with pytest.raises(SpecError, match=r"lacks 1 weight\(s\).*lm_head.weight"):
        target.load_drafter(out)


@pytest.mark.parametrize("kind,draft_vocab", [("depth_causal", None), ("parallel", 100), ("autoregressive", None)])
def test_decoding_is_lossless(target, kind, draft_vocab):
    drafter = _narrow(target, kind, draft_vocab)
    prompts = [list(range(3, 20)), list(range(40, 49))]
    config = GenerationConfig(max_new_tokens=20, num_draft_tokens=3)
    speculative = SpeculativeDecoder(target, drafter).generate(prompts, config)
    assert speculative.tokens == SpeculativeDecoder(target, None).generate(prompts, config).tokens


def test_a_drafter_for_another_target_is_still_refused(tmp_path, target):
    """Owning its embedding does not free a drafter from its target: the features are that target's."""
    out = _narrow(target).save(tmp_path / "drafter")
    with pytest.raises(SpecError, match="fingerprint"):
        tiny_target(seed=5).load_drafter(out)


@pytest.mark.parametrize("draft_vocab", [None, 100])
def test_onnx_graph_uses_the_own_modules(tmp_path, target, draft_vocab):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from portable_spec.adapters.onnx import OnnxBackend
    from portable_spec.adapters.onnx_export import export_onnx
    from portable_spec.core.backends import ReferenceBackend

    target.model.save_pretrained(tmp_path / "target")
    drafter_dir = _narrow(target, draft_vocab=draft_vocab).save(tmp_path / "drafter")
    graph = export_onnx(drafter_dir, tmp_path / "target", tmp_path / "graph")
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 9, 128, generator=generator)
    positions = torch.arange(9).expand(2, -1).clone()
    valid = torch.rand(2, 9, generator=generator) > 0.2
    block_ids = torch.randint(0, 250, (2, 1, 4), generator=generator)
    block_positions = (9 + torch.arange(4)).expand(2, 1, 4).clone()
    inputs = (features, positions, valid, block_ids, block_positions)
    expected = ReferenceBackend().block_logits(tmp_path / "target", drafter_dir, *inputs)
    actual = OnnxBackend().block_logits(tmp_path / "target", graph, *inputs)
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(actual))
    assert (actual[finite] - expected[finite]).abs().max().item() <= 1e-4
    prompts = [list(range(3, 20)), list(range(40, 52))]
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=3)
    onnx_out = OnnxBackend().decoder(tmp_path / "target", graph).generate(prompts, config)
    reference_out = ReferenceBackend().decoder(tmp_path / "target", drafter_dir).generate(prompts, config)
    assert onnx_out.tokens == reference_out.tokens
    assert onnx_out.stats.accepted_by_request == reference_out.stats.accepted_by_request


def test_training_reaches_the_own_embedding_and_head(target):
    """The loss trains a narrow drafter end to end, its own embedding and head included (fine-tuning an imported
    drafter)."""
    from portable_spec.training.loss import drafter_loss

    drafter = _narrow(target, draft_vocab=100).train()
    torch.manual_seed(0)
    tokens = torch.randint(0, 250, (2, 20))
    features = torch.randn(2, 20, drafter.config.feature_size)
    loss = drafter_loss(drafter, features, tokens, torch.tensor([[2, 9], [4, 12]]), gamma=4.0)
    loss.backward()
    assert drafter.embed_tokens.weight.grad.abs().sum() > 0 and drafter.lm_head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in target.model.parameters())


@pytest.mark.parametrize("layout", ["zlab", "specforge"])
def test_narrow_drafters_import_from_the_dflash_layout(tmp_path, target, layout):
    """As vLLM reads them: `target_hidden_size` beside the drafter's own width, embed_tokens and lm_head shipped.
    Imported, the checkpoint is the original (config and every weight)."""
    from portable_spec.adapters.upstream.importer import import_drafter
    from portable_spec.conformance.upstream_layouts import write_portable_as_upstream
    from portable_spec.core.checkpoint import load_drafter_files

    target.model.save_pretrained(tmp_path / "target")
    original = _narrow(target, "parallel").save(tmp_path / "drafter")
    upstream = write_portable_as_upstream(layout, tmp_path / layout, original)
    data = json.loads((upstream / "config.json").read_text())
    assert data["target_hidden_size"] == 64 and data["hidden_size"] == NARROW
    imported = import_drafter(upstream, tmp_path / "target", tmp_path / "imported").out
    (config, weights), (expected_config, expected) = load_drafter_files(imported), load_drafter_files(original)
    assert config.target.fingerprint == expected_config.target.fingerprint  # model_id: the target's path here
    assert config.model_copy(update={"target": expected_config.target}) == expected_config
    assert weights.keys() == expected.keys() and all(torch.equal(weights[n], expected[n]) for n in expected)


def test_narrow_import_refusals(tmp_path, target):
    from portable_spec.adapters.upstream.importer import import_drafter
    from portable_spec.conformance.upstream_layouts import write_portable_as_upstream

    target.model.save_pretrained(tmp_path / "target")
    upstream = write_portable_as_upstream("zlab", tmp_path / "zlab", _narrow(target, "parallel").save(tmp_path / "d"))
    data = json.loads((upstream / "config.json").read_text())
    (upstream / "config.json").write_text(json.dumps({**data, "target_hidden_size": 96}))
    with pytest.raises(SpecError, match="target_hidden_size = 96, the target .* is 64 wide"):
        import_drafter(upstream, tmp_path / "target", tmp_path / "out")
    (upstream / "config.json").write_text(json.dumps(data))
    weights = load_file(str(upstream / "model.safetensors"))
    del weights["embed_tokens.weight"]
    save_file(weights, str(upstream / "model.safetensors"))
    with pytest.raises(
        SpecError, match=r"48 wide for a 64-wide target needs its own .* lacks \['embed_tokens.weight'\]"
    ):
        import_drafter(upstream, tmp_path / "target", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_engines_that_borrow_the_targets_modules_refuse_by_name(tmp_path, target):
    """SGLang's DFLASH worker and TensorRT-LLM's DFlash drafter embed and score with the target's modules only;
    speculators' DFlash sizes fc from its own width. vLLM loads a drafter's own (tests/engines/test_vllm_adapter.py)."""
    from portable_spec.adapters.sglang.validate import check_servable
    from portable_spec.adapters.tensorrt_llm.export import ExportRequest, check_request
    from portable_spec.adapters.upstream.speculators import export_speculators
    from portable_spec.adapters.vllm.validate import check_servable as vllm_servable

    config = _narrow(target, "parallel").config
    with pytest.raises(
        SpecError, match="own_embeddings=true .*SGLang's DFlash drafter embeds and scores with the target"
    ):
        check_servable(config, "drafter")
    vllm_servable(config, "drafter")
    with pytest.raises(SpecError, match="route=dflash: own_embeddings=true .*modeling_dflash.py"):
        check_request(config, ExportRequest(trtllm_version="1.4.0"))
    assert check_request(config, ExportRequest(trtllm_version="1.4.0", route="onnx"))[0] == "onnx"
    target.model.save_pretrained(tmp_path / "target")
    with pytest.raises(SpecError, match="speculators format: its DFlash sizes fc from the drafter's own width"):
        export_speculators(_narrow(target, "parallel").save(tmp_path / "d"), tmp_path / "spec", tmp_path / "target")
    assert not (tmp_path / "spec").exists()


def test_widened_drafter_drafts_what_the_original_drafts(tmp_path):
    """conformance/widened.py, which the wider conformance rows and vLLM tests use: same tokens, same accepted
    lengths round by round, logits within float rounding."""
    from portable_spec.conformance.widened import widened
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    fixture = TargetModel.load(fixtures.target_dir())
    source = fixtures.ASSETS / "drafters" / "depth_causal"
    wide_dir = widened(source, fixture, tmp_path / "wide", 320)
    original, wide = fixture.load_drafter(source), fixture.load_drafter(wide_dir)
    assert wide.config.own_embeddings and wide.config.hidden_size == 320
    prompts = [entry["ids"] for entry in json.loads((fixtures.ASSETS / "heldout_prompts.json").read_text())[:4]]
    config = GenerationConfig(max_new_tokens=32, num_draft_tokens=15)
    a = SpeculativeDecoder(fixture, original).generate(prompts, config)
    b = SpeculativeDecoder(fixture, wide).generate(prompts, config)
    assert a.tokens == b.tokens and a.stats.accepted_by_request == b.stats.accepted_by_request
    assert a.stats.acceptance_length > 1.1  # drafts are accepted: the comparison is not all-rejected
    features = torch.randn(1, 10, original.config.feature_size)
    block = torch.full((1, 1, 16), original.config.mask_token_id)
    logits = [
        d.block_logits(
            block,
            10 + torch.arange(16)[None, None],
            d.context_kv(features, torch.arange(10)[None]),
            torch.ones(1, 10, dtype=bool),
        )
        for d in (original, wide)
    ]
    assert (logits[0] - logits[1]).abs().max().item() < 1e-3


def test_import_cli_says_the_drafter_owns_its_embedding(tmp_path, target, capsys):
    from portable_spec.cli import main
    from portable_spec.conformance.upstream_layouts import write_portable_as_upstream

    target.model.save_pretrained(tmp_path / "target")
    upstream = write_portable_as_upstream("zlab", tmp_path / "zlab", _narrow(target, "parallel").save(tmp_path / "d"))
    assert main(["import", str(upstream), str(tmp_path / "out"), "--target", str(tmp_path / "target")]) == 0
    assert "own embedding and head (48 wide, target 64)" in capsys.readouterr().out
