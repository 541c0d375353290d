"""The domino kind (SpecForge 0.2.0 Domino: DFlash's pass, a GRU over the block's tokens correcting each slot's
logits): its head against an independent formulation, the chain against teacher forcing, lossless decoding, import.
That the whole drafter computes what SpecForge's own DominoDraftModel computes is the `upstream/specforge/domino_*`
conformance rows (upstream venvs)."""

from __future__ import annotations

import json

import pytest
import torch

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import SpecError, parse_config
from portable_spec.core.testing import tiny_drafter, tiny_target

SMALL = {"emb_dim": 24, "gru_hidden_dim": 12}


@pytest.fixture(scope="module")
def target():
    return tiny_target(0)


def _block(drafter, anchor: int = 7):
    features = torch.randn(1, 12, drafter.config.feature_size, generator=torch.Generator().manual_seed(4))
    positions = torch.arange(12)[None]
    context = drafter.context_kv(features, positions)
    k = drafter.config.block_size
    block = torch.tensor([[[anchor] + [drafter.config.mask_token_id] * (k - 1)]])
    with torch.no_grad():
        hidden = drafter.block_hidden(block, (12 + torch.arange(k))[None, None], context, torch.ones(1, 12).bool())
    return hidden[:, 0]


def test_the_correction_is_specforges_formula(target):
    """Slot s (> pure_draft_prefix_len) adds W2 silu(W1 [h_s ; g_{s-1}]) with g the bias-free GRU's state after the
    embeddings of the block's tokens 0 .. s-1, written out here with the GRU equations (torch.nn.GRU's)."""
    drafter = tiny_drafter(target, "domino", variant_options={**SMALL, "pure_draft_prefix_len": 2})
    hidden = _block(drafter)
    tokens = torch.tensor([[7, 20, 30, 40, 50, 60, 70, 80]])
    with torch.no_grad():
        forced = drafter.teacher_forced_logits(hidden, tokens)  # [1, 7, V]
        base = drafter.scored_logits(hidden[:, 1:])
        gru = drafter.prefix_gru
        w_ih, w_hh = gru.weight_ih_l0, gru.weight_hh_l0
        state = torch.zeros(12)
        for slot in range(1, 8):
            x = target.model.get_input_embeddings()(tokens[0, slot - 1])
            r_i, z_i, n_i = (w_ih @ x).split(12)
            r_h, z_h, n_h = (w_hh @ state).split(12)
            r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
            state = (1 - z) * torch.tanh(n_i + r * n_h) + z * state
            proj = drafter.embed_proj
            correction = proj[2].weight @ torch.nn.functional.silu(proj[0].weight @ torch.cat((hidden[0, slot], state)))
            expected = base[0, slot - 1] + (correction if slot > 2 else 0)
            torch.testing.assert_close(forced[0, slot - 1], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prefix", [0, 2])
def test_the_chain_drafts_what_teacher_forcing_on_its_own_drafts_scores_best(target, prefix):
    drafter = tiny_drafter(target, "domino", variant_options={**SMALL, "pure_draft_prefix_len": prefix})
    hidden = _block(drafter)
    drafts, probability, _ = drafter.head_drafts(hidden, torch.tensor([7]), 7)
    with torch.no_grad():
        forced = drafter.teacher_forced_logits(hidden, torch.cat((torch.tensor([[7]]), drafts), dim=1))
    assert forced.argmax(-1).tolist() == drafts.tolist()
    plain = drafter.scored_logits(hidden[:, 1:]).argmax(-1)
    assert not torch.equal(plain, drafts), "the correction changed no pick"
    assert torch.equal(plain[:, :prefix], drafts[:, :prefix])  # the uncorrected slots draft DFlash's argmax


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoding_is_lossless(target, temperature):
    drafter = tiny_drafter(target, "domino", variant_options=SMALL)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7]]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=7, seed=2, sampling={"temperature": temperature})
    spec = SpeculativeDecoder(target, drafter).generate(prompts, config).tokens
    if temperature == 0:
        assert spec == SpeculativeDecoder(target).generate(prompts, config).tokens
    else:  # seeded: the same again (the distribution itself: conformance distribution/sampled/domino)
        assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"variant": {"kind": "domino", "gru_hidden_dim": 0}}, "gru_hidden_dim"),
        ({"variant": {"kind": "domino", **SMALL, "pure_draft_prefix_len": 8}}, "pure_draft_prefix_len=8 exceeds"),
        ({"variant": {"kind": "domino", **SMALL}, "draft_vocab_size": 32}, "a domino drafter scores the full"),
    ],
)
def test_config_rules_name_the_field(target, change, message):
    data = {**tiny_drafter(target, "parallel").config.to_json_dict(), **change}
    with pytest.raises(SpecError, match=message):
        parse_config(data)


def _specforge_dir(tmp_path, **dflash):
    """A SpecForge DominoDraftModel config.json (as its save_pretrained writes one) beside weights never read."""
    from safetensors.torch import save_file

    config = {"architectures": ["DominoDraftModel"], "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
              "vocab_size": 256, "rms_norm_eps": 1e-6, "block_size": 8,
              "dflash_config": {"target_layer_ids": [0, 1], "mask_token_id": 255, "projector_type": "domino", **dflash}}  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"fc.weight": torch.zeros(64, 128)}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_the_importer_reads_specforge_domino_switches(tmp_path):
    from portable_spec.adapters.upstream.layouts import read_upstream

    read = read_upstream(_specforge_dir(tmp_path / "ok", emb_dim=32, gru_hidden_dim=16))
    assert read.variant == {"kind": "domino", "emb_dim": 32, "gru_hidden_dim": 16, "pure_draft_prefix_len": 0}


@pytest.mark.parametrize(
    ("dflash", "message"),
    [
        ({"gru_hidden_dim": 16}, "dflash_config.emb_dim = null must be a whole number"),
        ({"emb_dim": 32, "gru_hidden_dim": 16, "shift_label": True}, "shift_label = true has no portable equivalent"),
    ],
)
def test_the_importer_refuses_what_domino_cannot_be_by_name(tmp_path, dflash, message):
    from portable_spec.adapters.upstream.layouts import read_upstream

    with pytest.raises(SpecError, match=message):
        read_upstream(_specforge_dir(tmp_path, **dflash))


def test_train_kind_domino_on_the_fixture(tmp_path):
    """`portable-spec train --kind domino`: the recipe end to end (the GRU-corrected cross-entropy, held-out
    acceptance through the chain), a checkpoint that loads as domino with the flags' sizes and decodes losslessly."""
    from portable_spec.cli.main import main
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    data = tmp_path / "share.json"
    conversations = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"note {i} on files"}]} for i in range(60)
    ]
    data.write_text(json.dumps(conversations))
    work, out = tmp_path / "work", tmp_path / "work" / "drafters" / "domino"
    argv = ["train", "--target", "fixture", "--kind", "domino", "--num-prompts", "16", "--max-new-tokens", "12",
            "--block-size", "4", "--num-hidden-layers", "1", "--seq-len", "32", "--batch-size", "4",
            "--anchors-per-seq", "4", "--heldout-eval-prompts", "3", "--eval-blocks", "4", "--reply-batch-size", "8",
            "--warmup-steps", "0", "--generator", "hf", "--steps", "30", "--lr", "3e-3", "--emb-dim", "32",
            "--gru-hidden-dim", "16", "--data", str(data), "--work-dir", str(work), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    losses = [json.loads(line)["loss"] for line in (work / "domino-loss.jsonl").read_text().splitlines()]
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    assert (work / "domino-heldout.jsonl").read_text().strip()
    target = TargetModel.load(fixtures.target_dir())
    drafter = target.load_drafter(out)
    assert (drafter.config.kind, drafter.config.variant.emb_dim, drafter.config.variant.gru_hidden_dim) == (
        "domino",
        32,
        16,
    )
    prompts = fixtures.heldout_prompts()[:2]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=3)
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == (
        SpeculativeDecoder(target).generate(prompts, config).tokens
    )
