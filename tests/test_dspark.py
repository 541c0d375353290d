"""The dspark kind (speculators 0.9.0 DSpark: DFlash's pass, a Markov head biasing each slot by the token before it,
a confidence head): its heads against independent formulations, the slot conventions, lossless decoding, import
and export. That the whole drafter computes what speculators' own DSparkDraftModel computes is the
`upstream/speculators/dspark_*` conformance rows (upstream venvs)."""

from __future__ import annotations

import json

import pytest
import torch

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.sampling import SamplingParams
from portable_spec.core.spec import SpecError, parse_config
from portable_spec.core.testing import tiny_drafter, tiny_target

SMALL = {"markov_rank": 16}
HEADS = [
    {"markov_head_type": "vanilla"},
    {"markov_head_type": "gated", "sample_from_anchor": False},
    {"markov_head_type": "rnn"},
    {"markov_head_type": "rnn", "sample_from_anchor": False, "confidence_head_with_markov": False},
]


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


def _block(drafter, anchor: int = 7):
    """One [anchor, MASK...] block's final states [1, k, H] after a 12-token context (the tiny target's features)."""
    target_features = torch.randn(1, 12, drafter.config.feature_size, generator=torch.Generator().manual_seed(4))
    positions = torch.arange(12)[None]
    context = drafter.context_kv(target_features, positions)
    k = drafter.config.block_size
    block = torch.tensor([[[anchor] + [drafter.config.mask_token_id] * (k - 1)]])
    with torch.no_grad():
        hidden = drafter.block_hidden(block, (12 + torch.arange(k))[None, None], context, torch.ones(1, 12).bool())
    return hidden[:, 0], context


def test_the_markov_heads_are_speculators_formulas(target):
    """vanilla W2 W1[prev]; gated W2 (sigmoid(G [h; W1[prev]]) * W1[prev]); rnn through its gated state, written
    out here slot by slot (speculators 0.9.0 models/dspark/model_definitions.py)."""
    generator = torch.Generator().manual_seed(0)
    prev, hidden = torch.randint(0, 256, (2, 5), generator=generator), torch.randn(2, 5, 64, generator=generator)
    for head_type in ("vanilla", "gated", "rnn"):
        drafter = tiny_drafter(target, "dspark", variant_options={**SMALL, "markov_head_type": head_type})
        head = drafter.markov_head
        with torch.no_grad():
            bias = head.block_bias(prev, hidden)
            embedding = head.markov_w1.weight[prev]
            if head_type == "vanilla":
                expected = embedding @ head.markov_w2.weight.T
            elif head_type == "gated":
                gate = torch.sigmoid(torch.cat((hidden, embedding), -1) @ head.gate_proj.weight.T + head.gate_proj.bias)
                expected = (gate * embedding) @ head.markov_w2.weight.T
            else:
                state, outputs = torch.zeros(2, 16), []
                for slot in range(5):
                    z = torch.cat((state, embedding[:, slot], hidden[:, slot]), -1)
                    g, c, o = (z @ head.joint_proj.weight.T + head.joint_proj.bias).split(16, dim=-1)
                    state = torch.sigmoid(g) * state + (1 - torch.sigmoid(g)) * torch.tanh(c)
                    outputs.append(torch.tanh(o) @ head.markov_w2.weight.T)
                expected = torch.stack(outputs, 1)
        torch.testing.assert_close(bias, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options", HEADS, ids=lambda o: "-".join(map(str, o.values())))
def test_the_chain_drafts_what_teacher_forcing_on_its_own_drafts_scores_best(target, options):
    """The greedy chain (decoding) and the teacher-forced logits (training, the oracle rows) are one function: fed the
    chain's own drafts as the true tokens, every draft slot's teacher-forced argmax is that slot's draft. And the
    Markov bias changes picks (else the test proves nothing)."""
    drafter = tiny_drafter(target, "dspark", variant_options={**SMALL, **options})
    hidden, _ = _block(drafter)
    n = drafter.config.max_draft_tokens
    drafts, probability, _ = drafter.head_drafts(hidden, torch.tensor([7]), n)
    tokens = torch.cat((torch.tensor([[7]]), drafts), dim=1)  # the anchor, then the drafts: [1, n + 1]
    with torch.no_grad():
        forced = drafter.teacher_forced_logits(hidden, tokens)  # [1, n, V]
    assert forced.argmax(-1).tolist() == drafts.tolist()
    assert probability.shape == (1, n) and bool(((probability > 0) & (probability < 1)).all())
    plain = drafter.scored_logits(hidden[:, drafter.draft_slots(n)]).argmax(-1)
    assert not torch.equal(plain, drafts), "the Markov bias changed no pick"


def test_the_anchor_slot_drafts_with_sample_from_anchor(target):
    """sample_from_anchor: slot 0 predicts the token after the anchor and a block of k slots drafts k tokens; without
    it slot 1 does, k - 1 (speculators' speculative_tokens)."""
    drafter = tiny_drafter(target, "dspark", variant_options=SMALL)
    dflash = tiny_drafter(target, "dspark", variant_options={**SMALL, "sample_from_anchor": False})
    assert drafter.config.max_draft_tokens == 8 and drafter.prediction_slot(1) == 0
    assert dflash.config.max_draft_tokens == 7 and dflash.prediction_slot(1) == 1
    drafter.config.check_num_draft_tokens(8)
    with pytest.raises(SpecError, match="use 1..7"):
        dflash.config.check_num_draft_tokens(8)


@pytest.mark.parametrize("options", HEADS, ids=lambda o: "-".join(map(str, o.values())))
def test_greedy_decoding_is_lossless_and_confidence_cuts_change_nothing(target, options):
    drafter = tiny_drafter(target, "dspark", variant_options={**SMALL, **options})
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [40, 41, 42, 43]]
    config = GenerationConfig(max_new_tokens=32, num_draft_tokens=drafter.config.max_draft_tokens)
    plain = SpeculativeDecoder(target).generate(prompts, config).tokens
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == plain
    cut = config.model_copy(update={"draft_confidence": 0.5})
    assert SpeculativeDecoder(target, drafter).generate(prompts, cut).tokens == plain


def test_the_confidence_head_sets_the_draft_probability(target):
    """With a confidence head, each draft's probability (what confidence cuts multiply) is its predicted
    acceptance, sigmoid(proj [h ; W1[prev]]); without one, the softmax probability of the draft."""
    drafter = tiny_drafter(target, "dspark", variant_options=SMALL)
    hidden, _ = _block(drafter)
    drafts, probability, _ = drafter.head_drafts(hidden, torch.tensor([7]), 3)
    previous = torch.cat((torch.tensor([7]), drafts[0, :2]))
    features = torch.cat((hidden[0, :3], drafter.markov_head.markov_w1.weight[previous]), -1)
    expected = torch.sigmoid(features @ drafter.confidence_head.proj.weight[0] + drafter.confidence_head.proj.bias)
    torch.testing.assert_close(probability[0], expected.detach(), rtol=1e-5, atol=1e-6)
    without = tiny_drafter(target, "dspark", variant_options={**SMALL, "confidence_head": False})
    assert not hasattr(without, "confidence_head")
    drafts, probability, _ = without.head_drafts(hidden, torch.tensor([7]), 1)
    logits = (
        without.scored_logits(hidden[:, 0]) + without.markov_head.block_bias(torch.tensor([[7]]), hidden[:, :1])[:, 0]
    )
    torch.testing.assert_close(probability[0, 0], logits.softmax(-1)[0, drafts[0, 0]].detach())


def test_a_reduced_draft_vocabulary_drafts_target_ids(target):
    """markov_w2 scores the draft vocabulary (as speculators' does): drafts are target ids inside it."""
    drafter = tiny_drafter(target, "dspark", variant_options=SMALL, draft_vocab_size=40)
    drafter.set_draft_vocab(torch.arange(100, 140))
    assert drafter.markov_head.markov_w2.weight.shape == (40, 16)
    hidden, _ = _block(drafter)
    drafts, _, _ = drafter.head_drafts(hidden, torch.tensor([7]), 8)
    assert all(100 <= token < 140 for token in drafts[0].tolist())


@torch.no_grad()  # the formulas are compared, not differentiated
def test_the_loss_adds_the_confidence_cross_entropy(target):
    """speculators 0.9.0 DSpark: the token cross-entropy on the Markov-biased logits (teacher-forced) plus, per
    slot, BCE(confidence, acceptance rate) with alpha 1; the rate here is q(label) (replies are the target's own
    tokens: p one-hot). Dropping the confidence head leaves the token term alone."""
    import torch.nn.functional as F

    from portable_spec.training.loss import drafter_loss, teacher_forced_blocks

    drafter = tiny_drafter(target, "dspark", variant_options=SMALL).requires_grad_(False)
    tokens = torch.randint(0, 255, (1, 30), generator=torch.Generator().manual_seed(1))
    features = target.features(tokens, torch.arange(30)[None], torch.ones_like(tokens).bool(), [0, 1])
    anchors = torch.tensor([[3, 11]])
    hidden, true_tokens = teacher_forced_blocks(drafter, features, tokens, anchors)
    assert true_tokens.shape == (1, 2, 9)  # the anchor and eight labels
    logits = drafter.teacher_forced_logits(hidden, true_tokens)
    labels = true_tokens[..., 1:]
    token_loss = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(1, 2, 8)
    rate = logits.softmax(-1).gather(-1, labels[..., None])[..., 0]
    confidence = drafter.confidence_head(
        torch.cat((hidden, drafter.markov_head.markov_w1.weight[true_tokens[..., :-1]]), -1)
    )
    bce = F.binary_cross_entropy_with_logits(confidence, rate, reduction="none")
    weights = torch.exp(-torch.arange(8.0) / 7.0)
    expected = ((token_loss + bce) * weights).sum() / (weights.sum() * 2)
    loss = drafter_loss(drafter, features, tokens, anchors, 7.0)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"variant": {"kind": "dspark", "markov_rank": 0}}, "markov_rank"),
        ({"variant": {"kind": "dspark", "markov_head_type": "lstm"}}, "markov_head_type"),
    ],
)
def test_config_rules_name_the_field(target, change, message):
    data = {**tiny_drafter(target, "parallel").config.to_json_dict(), **change}
    with pytest.raises(SpecError, match=message):
        parse_config(data)


def _speculators_dir(tmp_path, **keys):
    """A speculators DSpark config.json (as DSparkSpeculatorConfig writes one) beside weights that are never read."""
    layer = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 32, "intermediate_size": 128, "vocab_size": 256, "rms_norm_eps": 1e-6, "model_type": "qwen3"}  # fmt: skip
    config = {"speculators_model_type": "dspark", "transformer_layer_config": layer, "block_size": 8,
              "aux_hidden_state_layer_ids": [1, 2], "mask_token_id": 255, **keys}  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    from safetensors.torch import save_file

    save_file({"fc.weight": torch.zeros(64, 128)}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_the_importer_reads_speculators_dspark_switches_with_its_defaults(tmp_path):
    from portable_spec.adapters.upstream.layouts import read_upstream

    read = read_upstream(_speculators_dir(tmp_path / "defaults"))
    assert read.variant == {"kind": "dspark", "sample_from_anchor": True, "markov_rank": 256,
                            "markov_head_type": "vanilla", "confidence_head": True, "confidence_head_with_markov": True}  # fmt: skip
    read = read_upstream(_speculators_dir(tmp_path / "set", markov_head_type="rnn", enable_confidence_head=False))
    assert read.variant["markov_head_type"] == "rnn" and read.variant["confidence_head"] is False


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"markov_rank": 0}, "markov_rank = 0 turns DSpark's Markov head off"),
        ({"markov_head_type": "lstm"}, 'markov_head_type = "lstm" is not one of vanilla, gated, rnn'),
        ({"sample_from_anchor": "yes"}, 'sample_from_anchor = "yes" must be true or false'),
    ],
)
def test_the_importer_refuses_what_dspark_cannot_be_by_name(tmp_path, keys, message):
    from portable_spec.adapters.upstream.layouts import read_upstream

    with pytest.raises(SpecError, match=message):
        read_upstream(_speculators_dir(tmp_path, **keys))


@pytest.mark.parametrize("kind", ["dspark", "dflash2"])
def test_sampled_drafts_are_drawn_from_the_q_verification_gets(target, kind, monkeypatch):
    """At T > 0 a sequential head draws each draft from its own distribution given the drafts before it (seeded draft
    noise, sampling.DraftSampler) and the loop verifies with that q: every draft has q > 0, q rows sum to 1, a
    dflash2's q lives on its candidates only, greedy rows of the same batch keep greedy drafts and a one-hot q, and
    plain kinds keep drafting greedily (q None)."""
    from portable_spec.core import decode

    options = SMALL if kind == "dspark" else {"selector_rank": 16, "selector_top_k": 8}
    drafter = tiny_drafter(target, kind, variant_options=options)
    seen = []
    verify = decode.verify_op

    def recording(logits, drafts, sampling, noise, draft_probs=None, num_drafts=None):
        seen.append((drafts.clone(), None if draft_probs is None else draft_probs.clone()))
        return verify(logits, drafts, sampling, noise, draft_probs, num_drafts=num_drafts)

    monkeypatch.setattr(decode, "verify_op", recording)
    sampled = GenerationConfig(max_new_tokens=20, num_draft_tokens=5, seed=1, sampling={"temperature": 1.0})
    SpeculativeDecoder(target, drafter).generate([[1, 2, 3], [4, 5, 6, 7]], sampled)
    drafts, q = seen[1]  # seen[0] is the prefill's
    assert q is not None and q.shape == (2, 5, 256)
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 5))
    assert bool((q.gather(-1, drafts[..., None]) > 0).all())
    if kind == "dflash2":
        assert bool(((q > 0).sum(-1) <= 8).all())  # the candidates only
    seen.clear()
    greedy = sampled.model_copy(update={"sampling": SamplingParams(temperature=0.0)})
    SpeculativeDecoder(target, drafter).generate([[1, 2, 3]], greedy)
    assert seen[1][1] is None  # an all-greedy batch drafts greedily, as before
    seen.clear()
    SpeculativeDecoder(target, tiny_drafter(target, "parallel")).generate([[1, 2, 3]], sampled)
    assert seen[1][1] is None


def test_seeded_sampling_repeats_and_the_seed_changes_drafts(target):
    drafter = tiny_drafter(target, "dspark", variant_options=SMALL)
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=5, seed=3, sampling={"temperature": 0.9})
    first = SpeculativeDecoder(target, drafter).generate([[5, 6, 7]], config).tokens
    assert SpeculativeDecoder(target, drafter).generate([[5, 6, 7]], config).tokens == first
    other = config.model_copy(update={"seed": 4})
    assert SpeculativeDecoder(target, drafter).generate([[5, 6, 7]], other).tokens != first


def test_train_kind_dspark_on_the_fixture(tmp_path):
    """`portable-spec train --kind dspark`: the recipe end to end (replies, features, anchors with a label after the
    block, the Markov-biased loss + the confidence BCE, held-out acceptance through the chain), a checkpoint that
    loads as dspark with the flags' switches and decodes losslessly with every slot drafting."""
    from portable_spec.cli.main import main
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    data = tmp_path / "share.json"
    conversations = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"note {i} on files"}]} for i in range(60)
    ]
    data.write_text(json.dumps(conversations))
    work, out = tmp_path / "work", tmp_path / "work" / "drafters" / "dspark"
    argv = ["train", "--target", "fixture", "--kind", "dspark", "--num-prompts", "16", "--max-new-tokens", "12",
            "--block-size", "4", "--num-hidden-layers", "1", "--seq-len", "32", "--batch-size", "4",
            "--anchors-per-seq", "4", "--heldout-eval-prompts", "3", "--eval-blocks", "4", "--reply-batch-size", "8",
            "--warmup-steps", "0", "--generator", "hf", "--steps", "30", "--lr", "3e-3", "--markov-rank", "16",
            "--markov-head-type", "gated", "--data", str(data), "--work-dir", str(work), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    losses = [json.loads(line)["loss"] for line in (work / "dspark-loss.jsonl").read_text().splitlines()]
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    assert (work / "dspark-heldout.jsonl").read_text().strip()
    target = TargetModel.load(fixtures.target_dir())
    drafter = target.load_drafter(out)
    variant = drafter.config.variant
    assert (drafter.config.kind, variant.markov_head_type, variant.markov_rank) == ("dspark", "gated", 16)
    prompts = fixtures.heldout_prompts()[:2]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=4)  # = block_size: the anchor's slot drafts
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == (
        SpeculativeDecoder(target).generate(prompts, config).tokens
    )
