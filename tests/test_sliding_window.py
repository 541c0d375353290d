"""Sliding-window drafter layers and the parallel kind's block attention: the spec's rules, the reference math
against masks written out by hand, training's packed blocks against decoding's single block, lossless decoding."""

import json

import pytest
import torch

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.drafter import Drafter
from portable_spec.core.spec import SpecError, parse_config
from portable_spec.core.testing import tiny_drafter, tiny_target
from portable_spec.training.loss import block_predictions

WINDOW = 8
MIXED = ["sliding_attention", "full_attention"]
SLIDING = ["sliding_attention", "sliding_attention"]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _config_dict(target, **attention):
    return tiny_drafter(target, "parallel", block_size=4, **attention).config.to_json_dict()


def _refused(data, pattern):
    with pytest.raises(SpecError, match=pattern):
        parse_config(data)


def test_spec_rules(target):
    base = _config_dict(target)
    assert "sliding_window" not in base and base["layer_types"] == ["full_attention"] * 2
    assert base["is_causal"] is False and base["use_sliding_window"] is False
    _refused({**base, "layer_types": SLIDING}, "no sliding_window")
    _refused({**base, "sliding_window": 64}, "no layer is sliding_attention")
    _refused({**base, "layer_types": SLIDING, "sliding_window": 3}, r"smaller than block_size=4")
    _refused({**base, "layer_types": ["sliding_attention"], "sliding_window": 64}, "1 entries but num_hidden_layers=2")
    _refused({**base, "layer_types": ["chunked_attention"] * 2, "sliding_window": 64}, "layer_types")
    causal_in_sliding = {**base, "variant": {"kind": "parallel", "block_attention": "causal_in_sliding_layers"}}
    _refused(causal_in_sliding, "needs sliding_attention layers")
    # all-full layer_types is the default, stored once: a config written either way is one config
    assert parse_config({**base, "layer_types": ["full_attention"] * 2}) == parse_config(base)


@pytest.mark.parametrize(
    "layer_types,block_attention,is_causal,causal_per_layer",
    [
        (SLIDING, "bidirectional", False, [False, False]),
        (SLIDING, "causal", True, [True, True]),
        (MIXED, "causal_in_sliding_layers", None, [True, False]),  # null: engines resolve it from layer_types
        (SLIDING, "causal_in_sliding_layers", True, [True, True]),
    ],
)
def test_engine_keys_resolve_as_the_engines_do(target, layer_types, block_attention, is_causal, causal_per_layer):
    """vLLM's `_resolve_layer_attention`, SGLang's `_get_dflash_layer_attention_params` and z-lab's attention all
    read: is_causal when set, else causal exactly on sliding layers; the window from sliding_window (kept by
    transformers' Qwen3Config only with use_sliding_window)."""
    config = tiny_drafter(
        target,
        "parallel",
        block_size=4,
        layer_types=layer_types,
        sliding_window=WINDOW,
        block_attention=block_attention,
    ).config
    data = json.loads(json.dumps(config.to_json_dict()))
    assert data["is_causal"] is is_causal and data["use_sliding_window"] is True
    assert data["sliding_window"] == WINDOW and data["layer_types"] == layer_types
    engine_causal = [
        data["is_causal"] if data["is_causal"] is not None else kind == "sliding_attention" for kind in layer_types
    ]
    assert engine_causal == causal_per_layer == [config.layer_attention(i).block_causal for i in range(2)]
    assert [config.layer_attention(i).window for i in range(2)] == [
        WINDOW if kind == "sliding_attention" else None for kind in layer_types
    ]
    assert parse_config(data) == config


def _context(drafter, length, seed=3):
    torch.manual_seed(seed)
    features = torch.randn(1, length, drafter.config.feature_size)
    positions = torch.arange(length)[None]
    return drafter.context_kv(features, positions), positions


def _hand_window_mask(length, block_positions, window):
    """[1, k, T]: slot at position p sees context position c iff p - c < window, written out element by element."""
    rows = [[p - c < window for c in range(length)] for p in block_positions]
    return torch.tensor(rows)[None]


@pytest.mark.parametrize("kind", ["parallel", "depth_causal"])
def test_all_sliding_equals_full_attention_with_the_window_cut_by_hand(target, kind):
    """A drafter whose layers all slide gives the logits of the same weights attending fully to a context cut by a
    per-slot mask built by hand: the window is exactly q_pos - k_pos < sliding_window."""
    length, k = 20, 4
    sliding = tiny_drafter(target, kind, block_size=k, layer_types=SLIDING, sliding_window=WINDOW)
    full = target.bind(Drafter(tiny_drafter(target, kind, block_size=k).config))
    full.load_state_dict(sliding.state_dict())
    context, positions = _context(sliding, length)
    block = torch.tensor([[[5, 9, 9, 9]]])
    block_positions = length + torch.arange(k)[None, None]
    valid = torch.ones(1, length, dtype=torch.bool)
    with torch.no_grad():
        windowed = sliding.block_logits(block, block_positions, context, valid, positions)
        by_hand = full.block_logits(
            block, block_positions, context, _hand_window_mask(length, block_positions[0, 0].tolist(), WINDOW)
        )
        unwindowed = full.block_logits(block, block_positions, context, valid)
    torch.testing.assert_close(windowed, by_hand, atol=1e-5, rtol=1e-5)
    assert (windowed - unwindowed).abs().max() > 1e-3  # the window does cut something here


def test_a_sliding_layer_needs_context_positions(target):
    drafter = tiny_drafter(target, "parallel", block_size=4, layer_types=SLIDING, sliding_window=WINDOW)
    context, _ = _context(drafter, 10)
    with pytest.raises(ValueError, match="context_positions"):
        drafter.block_logits(
            torch.tensor([[[5, 9, 9, 9]]]), 10 + torch.arange(4)[None, None], context, torch.ones(1, 10).bool()
        )


@pytest.mark.parametrize(
    "block_attention,earlier_slots_unchanged",
    [("bidirectional", False), ("causal", True), ("causal_in_sliding_layers", False)],
)
def test_block_attention_per_layer(target, block_attention, earlier_slots_unchanged):
    """A later slot reaches earlier ones unless every layer is causal (the mixed drafter's full layer is not)."""
    drafter = tiny_drafter(
        target, "parallel", block_size=6, layer_types=MIXED, sliding_window=WINDOW, block_attention=block_attention
    )
    assert drafter.config.block_causal == earlier_slots_unchanged
    context, positions = _context(drafter, 12)
    ids = torch.tensor([[[3, 9, 9, 9, 9, 9]]])
    changed = ids.clone()
    changed[0, 0, 4] = 17
    valid = torch.ones(1, 12, dtype=torch.bool)
    block_positions = 12 + torch.arange(6)[None, None]
    with torch.no_grad():
        a, b = (drafter.block_logits(x, block_positions, context, valid, positions) for x in (ids, changed))
    assert torch.equal(a[..., :4, :], b[..., :4, :]) == earlier_slots_unchanged


@pytest.mark.parametrize(
    "block_attention,window_rule",
    [("bidirectional", "per_slot"), ("causal_in_sliding_layers", "per_slot"), ("causal", "per_anchor")],
)
def test_training_blocks_equal_decoding_blocks(target, block_attention, window_rule):
    """Training's packed blocks (per-slot dense masks, many anchors per row) give each anchor's block the logits
    decoding gives it alone: the window is cut the same way in both, per slot or per anchor."""
    drafter = tiny_drafter(
        target,
        "parallel",
        block_size=4,
        layer_types=MIXED,
        sliding_window=WINDOW,
        block_attention=block_attention,
        window_rule=window_rule,
    )
    torch.manual_seed(0)
    length = 30
    tokens = torch.randint(0, 200, (1, length))
    features = torch.randn(1, length, drafter.config.feature_size)
    anchors = torch.tensor([[3, 11, 19, 25]])
    with torch.no_grad():
        packed, _ = block_predictions(drafter, features, tokens, anchors)
        positions = torch.arange(length)[None]
        context = drafter.context_kv(features, positions)
        for index, anchor in enumerate(anchors[0].tolist()):
            block = torch.full((1, 1, 4), drafter.config.mask_token_id)
            block[0, 0, 0] = tokens[0, anchor]
            alone = drafter.block_hidden(
                block, anchor + torch.arange(4)[None, None], context, positions < anchor, positions
            )
            torch.testing.assert_close(drafter.scored_logits(alone)[0, 0, 1:], packed[0, index], atol=1e-5, rtol=1e-5)


def test_a_per_anchor_window_gives_every_slot_the_anchors_context(target):
    """window_rule=per_anchor: each slot sees context positions >= anchor - W (speculators' trainer); per_slot: slot
    j sees positions > anchor + j - W. Slot 0 differs too (per_slot sees W - 1 context positions, per_anchor W)."""
    from portable_spec.core.drafter import _layer_mask

    positions = torch.arange(20)[None]
    queries = 12 + torch.arange(4)[None]  # one block, anchor at 12
    valid = positions < 12
    masks = {}
    for rule in ("per_slot", "per_anchor"):
        config = tiny_drafter(target, "parallel", block_size=4, layer_types=SLIDING, sliding_window=WINDOW,
                              window_rule=rule).config  # fmt: skip
        masks[rule] = _layer_mask(config.layer_attention(0), valid, queries, positions, 4, 1).dense[0, 0, :, :20]
    seen = {rule: [mask[slot].nonzero()[:, 0].tolist() for slot in range(4)] for rule, mask in masks.items()}
    assert seen["per_anchor"] == [list(range(12 - WINDOW, 12))] * 4
    assert seen["per_slot"] == [list(range(12 + slot - WINDOW + 1, 12)) for slot in range(4)]


@pytest.mark.parametrize("kind,layer_types", [("parallel", MIXED), ("depth_causal", SLIDING)])
def test_decoding_with_windows_is_lossless(target, kind, layer_types):
    """Prompts and replies well past the window: speculative output equals the target's greedy output."""
    drafter = tiny_drafter(target, kind, block_size=4, layer_types=layer_types, sliding_window=WINDOW)
    prompts = [list(range(3, 3 + 17)), list(range(40, 40 + 9))]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=3)
    speculative = SpeculativeDecoder(target, drafter).generate(prompts, config)
    plain = SpeculativeDecoder(target, None).generate(prompts, config)
    assert speculative.tokens == plain.tokens


@pytest.mark.parametrize(
    "kind,layer_types,block_attention",
    [("parallel", MIXED, "causal_in_sliding_layers"), ("depth_causal", SLIDING, None)],
)
def test_onnx_graph_cuts_the_same_window(tmp_path, target, kind, layer_types, block_attention):
    """The exported graph builds the window from its position inputs: block logits equal the reference's over a
    context longer than the window (holes included), and decoding through ONNX Runtime gives the reference's tokens
    and accepted lengths."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from portable_spec.adapters.onnx import OnnxBackend
    from portable_spec.adapters.onnx_export import export_onnx
    from portable_spec.core.backends import ReferenceBackend

    attention = {"block_attention": block_attention} if block_attention else {}
    drafter = tiny_drafter(target, kind, block_size=4, layer_types=layer_types, sliding_window=WINDOW, **attention)
    target.model.save_pretrained(tmp_path / "target")
    drafter_dir = drafter.save(tmp_path / "drafter")
    graph = export_onnx(drafter_dir, tmp_path / "target", tmp_path / "graph")
    generator = torch.Generator().manual_seed(0)
    length = 21
    features = torch.randn(2, length, drafter.config.feature_size, generator=generator)
    positions = torch.arange(length).expand(2, -1).clone()
    valid = torch.rand(2, length, generator=generator) > 0.2
    block_ids = torch.randint(0, 250, (2, 1, 4), generator=generator)
    block_positions = (length + torch.arange(4)).expand(2, 1, 4).clone()
    inputs = (features, positions, valid, block_ids, block_positions)
    expected = ReferenceBackend().block_logits(tmp_path / "target", drafter_dir, *inputs)
    actual = OnnxBackend().block_logits(tmp_path / "target", graph, *inputs)
    assert (actual - expected).abs().max().item() <= 1e-4
    prompts = [list(range(3, 20)), list(range(40, 52))]
    config = GenerationConfig(max_new_tokens=20, num_draft_tokens=3)
    onnx_out = OnnxBackend().decoder(tmp_path / "target", graph).generate(prompts, config)
    reference_out = ReferenceBackend().decoder(tmp_path / "target", drafter_dir).generate(prompts, config)
    assert onnx_out.tokens == reference_out.tokens
    assert onnx_out.stats.accepted_by_request == reference_out.stats.accepted_by_request
