"""The dflash2 kind (z-lab DFlash2: convolutions along the block around every sublayer, a candidate selector): its
pieces against independent formulations, its config rules, and lossless decoding. That the whole drafter computes
what z-lab's own DFlash2DraftModel computes is the `upstream/dflash/dflash2_*` conformance rows (upstream venvs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.drafter import Drafter
from portable_spec.core.drafter_layers import GroupedDynamicCausalConv, grouped_causal_convolve
from portable_spec.core.head_step import chain_drafts
from portable_spec.core.spec import ParallelVariant, SpecError, parse_config
from portable_spec.core.testing import tiny_drafter, tiny_target

SMALL = {"selector_rank": 16, "selector_top_k": 8}


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


def test_the_static_convolution_is_a_causal_depthwise_conv1d_within_each_block():
    """With no dynamic part, out_j = sum_t base[t] * h_{j-t} per channel: torch's conv1d (groups = channels, the
    kernel flipped, left padding), run on each block separately."""
    generator = torch.Generator().manual_seed(0)
    h = torch.randn(2, 3, 8, 32, generator=generator)  # [B, A blocks, k slots, H]
    base = torch.randn(3, 32, generator=generator)
    out = grouped_causal_convolve(h, torch.zeros(2, 3, 8, 3, 4), base, group_size=8)
    blocks = h.reshape(6, 8, 32).transpose(1, 2)  # [blocks, H, k]
    expected = F.conv1d(F.pad(blocks, (2, 0)), base.T.flip(-1)[:, None, :], groups=32)
    torch.testing.assert_close(out, expected.transpose(1, 2).reshape(2, 3, 8, 32))


def test_the_dynamic_part_scales_each_channel_group_by_its_slot_coefficient():
    h = torch.randn(1, 1, 4, 8)
    dynamic = torch.zeros(1, 1, 4, 2, 2)  # [.., k, taps, groups of 4 channels]
    dynamic[0, 0, 2, 1, 1] = 3.0  # slot 2, tap 1, group 1: + 3 * h_1 on channels 4..7
    out = grouped_causal_convolve(h, dynamic, torch.zeros(2, 8), group_size=4)
    expected = torch.zeros_like(h)
    expected[0, 0, 2, 4:] = 3.0 * h[0, 0, 1, 4:]
    torch.testing.assert_close(out, expected)


def test_a_slot_never_sees_a_later_slot_or_the_block_before():
    conv = GroupedDynamicCausalConv(16, kernel_size=3, group_size=4)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    h = torch.randn(1, 2, 6, 16)
    changed = h.clone()
    changed[0, 0, 4:] += 1.0  # the first block's last slots
    out, kernel = conv.prepare(h)
    out2, kernel2 = conv.prepare(changed)
    assert torch.equal(out[0, 0, :4], out2[0, 0, :4]) and not torch.equal(out[0, 0, 4:], out2[0, 0, 4:])
    assert torch.equal(out[0, 1], out2[0, 1])  # the next block's first slots see zeros, not the block before
    assert torch.equal(kernel[0, 0, :4], kernel2[0, 0, :4])


def test_a_new_dflash2_drafter_computes_dflash(target):
    """Convolutions start as the identity (speculators 0.9.0 reset_parameters): with the same layer weights, a new
    dflash2 drafter's block logits are the parallel drafter's."""
    config = tiny_drafter(target, "dflash2", variant_options=SMALL).config
    torch.manual_seed(0)
    fresh = target.bind(Drafter(config)).eval()
    parallel = target.bind(Drafter(config.model_copy(update={"variant": ParallelVariant()}))).eval()
    missing, unexpected = parallel.load_state_dict(fresh.state_dict(), strict=False)
    assert not missing and all("_conv." in name or "candidate_selector." in name for name in unexpected)
    features = torch.randn(1, 5, config.feature_size)
    positions = torch.arange(5)[None]
    block = torch.tensor([[[3] + [config.mask_token_id] * 7]])
    block_positions = (5 + torch.arange(8))[None, None]
    valid = torch.ones(1, 5, dtype=torch.bool)
    expected = parallel.block_logits(block, block_positions, parallel.context_kv(features, positions), valid)
    actual = fresh.eval().block_logits(block, block_positions, fresh.context_kv(features, positions), valid)
    torch.testing.assert_close(actual, expected)


def test_the_selector_picks_by_unary_plus_bigram_scores_slot_after_slot(target):
    drafter = tiny_drafter(target, "dflash2", variant_options=SMALL)
    selector = drafter.candidate_selector.requires_grad_(False)
    generator = torch.Generator().manual_seed(1)
    hidden, logits = torch.randn(2, 5, 64, generator=generator), torch.randn(2, 5, 256, generator=generator)
    anchor = torch.tensor([7, 9])
    step = drafter.head_step()
    assert step.slots.first == step.slots.first_draft == 1  # slot 0 holds the anchor: prepend it to the states
    block = lambda x: torch.cat((torch.zeros_like(x[:, :1]), x), dim=1)  # noqa: E731
    drafts, probability, _ = chain_drafts(
        step, step.slots, block(hidden), logits, anchor, 5, step.initial_state(hidden)
    )
    for row in range(2):  # written out: every candidate's score, one slot at a time
        previous = int(anchor[row])
        for slot in range(5):
            candidates = logits[row, slot].topk(8).indices
            projected = selector.hidden_projection.weight @ hidden[row, slot]
            scores = torch.stack([
                logits[row, slot, c] + (selector.predecessor_codebook[previous] * projected
                                        * selector.successor_codebook[c]).sum()
                for c in candidates
            ])  # fmt: skip
            best = int(candidates[scores.argmax()])
            assert int(drafts[row, slot]) == best
            assert float(probability[row, slot]) == pytest.approx(float(scores.softmax(0).max()), rel=1e-5)
            previous = best
    assert not torch.equal(drafts, logits.argmax(-1)), "the bigram scores changed no pick: the test proves nothing"


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_decoding_is_lossless_and_confidence_cuts_change_nothing(target, batch):
    drafter = tiny_drafter(target, "dflash2", variant_options=SMALL)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [40, 41, 42, 43]][:batch]
    config = GenerationConfig(max_new_tokens=32, num_draft_tokens=7)
    plain = SpeculativeDecoder(target).generate(prompts, config).tokens
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == plain
    cut = config.model_copy(update={"draft_confidence": 0.5})
    assert SpeculativeDecoder(target, drafter).generate(prompts, cut).tokens == plain


def test_seeded_sampling_repeats(target):
    drafter = tiny_drafter(target, "dflash2", variant_options=SMALL)
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=5, seed=3, sampling={"temperature": 0.9})
    first = SpeculativeDecoder(target, drafter).generate([[5, 6, 7]], config).tokens
    assert SpeculativeDecoder(target, drafter).generate([[5, 6, 7]], config).tokens == first


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"variant": {"kind": "dflash2", "conv_group_size": 24}}, "conv_group_size=24 does not divide hidden_size=64"),
        ({"variant": {"kind": "dflash2", "conv_kernel_size": 9}}, "conv_kernel_size=9 is wider than block_size=8"),
        ({"variant": {"kind": "dflash2", "selector_top_k": 300}}, "selector_top_k=300 exceeds vocab_size=256"),
        ({"variant": {"kind": "dflash2"}, "draft_vocab_size": 32}, "a dflash2 drafter scores the full vocabulary"),
    ],
)
def test_config_rules_name_the_field(target, change, message):
    data = {**tiny_drafter(target, "parallel").config.to_json_dict(), **change}
    with pytest.raises(SpecError, match=message):
        parse_config(data)


def test_the_selector_loss_is_the_k_way_cross_entropy_with_the_target_injected(target):
    """speculators 0.9.0 compute_selector_loss: candidates = the slot's top-k; a target outside them replaces the
    last candidate; the label is its rank; the predecessor is the true token before (teacher forcing)."""
    from portable_spec.training.loss import selector_losses

    drafter = tiny_drafter(target, "dflash2", variant_options=SMALL).requires_grad_(False)
    generator = torch.Generator().manual_seed(2)
    hidden, logits = torch.randn(1, 1, 3, 64, generator=generator), torch.randn(1, 1, 3, 256, generator=generator)
    outside = int(logits[0, 0, 1].argsort()[0])  # the least likely token: never a candidate
    true_tokens = torch.tensor([[[5, int(logits[0, 0, 0].argmax()), outside, int(logits[0, 0, 2].topk(3).indices[2])]]])
    losses = selector_losses(drafter, hidden, logits, true_tokens)
    selector = drafter.candidate_selector
    for slot in range(3):
        candidates = logits[0, 0, slot].topk(8).indices.clone()
        target_id = int(true_tokens[0, 0, slot + 1])
        if target_id not in candidates.tolist():
            candidates[-1] = target_id
        projected = selector.hidden_projection.weight @ hidden[0, 0, slot]
        context = selector.predecessor_codebook[int(true_tokens[0, 0, slot])] * projected
        scores = logits[0, 0, slot, candidates] + selector.successor_codebook[candidates] @ context
        expected = F.cross_entropy(scores[None], torch.tensor([candidates.tolist().index(target_id)]))
        assert float(losses[0, 0, slot]) == pytest.approx(float(expected), rel=1e-5)


def test_train_kind_dflash2_on_the_fixture(tmp_path):
    """`portable-spec train --kind dflash2`: the recipe end to end (replies, features, the unary + selector loss,
    held-out acceptance through the selector), a checkpoint that loads as dflash2 and decodes losslessly."""
    import json

    from portable_spec.cli.main import main
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    data = tmp_path / "share.json"
    conversations = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"note {i} on files"}]} for i in range(60)
    ]
    data.write_text(json.dumps(conversations))
    work, out = tmp_path / "work", tmp_path / "work" / "drafters" / "dflash2"
    argv = ["train", "--target", "fixture", "--kind", "dflash2", "--num-prompts", "16", "--max-new-tokens", "12",
            "--block-size", "4", "--num-hidden-layers", "1", "--seq-len", "32", "--batch-size", "4",
            "--anchors-per-seq", "4", "--heldout-eval-prompts", "3", "--eval-blocks", "4", "--reply-batch-size", "8",
            "--warmup-steps", "0", "--generator", "hf", "--steps", "30", "--lr", "3e-3", "--selector-rank", "16",
            "--selector-top-k", "8", "--data", str(data), "--work-dir", str(work), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    losses = [json.loads(line)["loss"] for line in (work / "dflash2-loss.jsonl").read_text().splitlines()]
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    assert (work / "dflash2-heldout.jsonl").read_text().strip()
    target = TargetModel.load(fixtures.target_dir())
    drafter = target.load_drafter(out)
    assert drafter.config.kind == "dflash2" and drafter.config.variant.selector_top_k == 8
    prompts = fixtures.heldout_prompts()[:2]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=3)
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == (
        SpeculativeDecoder(target).generate(prompts, config).tokens
    )


def test_depthwise_shift_mix_trains_the_static_taps_alone_and_passes_the_argmax_through(tmp_path):
    """`train --kind dflash2 --depthwise-shift-mix` (issue 45 item 6): the checkpoint's kernel projections and
    selector are exactly zero, its base taps moved away from the identity they start at, and its drafts are the
    plain argmax of its logits (the pass-through selector), so it is depth_causal's shift-mix made depthwise, in
    a file any DFlash2 reader takes."""
    import json

    from portable_spec.cli.main import main
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    data = tmp_path / "share.json"
    conversations = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"note {i} on files"}]} for i in range(40)
    ]
    data.write_text(json.dumps(conversations))
    work, out = tmp_path / "work", tmp_path / "work" / "drafters" / "depthwise"
    argv = ["train", "--target", "fixture", "--kind", "dflash2", "--depthwise-shift-mix", "--num-prompts", "8",
            "--max-new-tokens", "12", "--block-size", "4", "--num-hidden-layers", "1", "--seq-len", "32",
            "--batch-size", "4", "--anchors-per-seq", "4", "--heldout-eval-prompts", "0", "--reply-batch-size", "8",
            "--warmup-steps", "0", "--generator", "hf", "--steps", "6", "--lr", "3e-3", "--selector-rank", "16",
            "--selector-top-k", "8", "--data", str(data), "--work-dir", str(work), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    target = TargetModel.load(fixtures.target_dir())
    drafter = target.load_drafter(out)
    assert drafter.config.kind == "dflash2"
    for layer in drafter.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            assert not conv.kernel_projection.weight.any()
            assert not torch.equal(conv.base_kernel[:, 1], torch.zeros_like(conv.base_kernel[:, 1]))  # trained
    assert all(not param.any() for param in drafter.candidate_selector.parameters())
    hidden = torch.randn(5, 4, drafter.config.hidden_size, generator=torch.Generator().manual_seed(0))
    anchors = torch.randint(0, drafter.config.vocab_size, (5,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        drafts = drafter.head_drafts(hidden, anchors, 3)[0]
        plain = drafter.scored_logits(hidden[:, drafter.draft_slots(3)]).argmax(dim=-1)
    assert torch.equal(drafts, plain)
