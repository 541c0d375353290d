"""`export gguf` without llama.cpp: what it writes (read back with the gguf package) and what it refuses by name
before anything loads. That llama.cpp loads and runs it: tests/engines/test_llamacpp.py (the llama.cpp stage)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from safetensors.torch import load_file

from portable_spec.adapters.llamacpp.gguf_export import DRAFTER_FILE, export_gguf
from portable_spec.core import fixtures
from portable_spec.core.spec import SpecError


def _target_gguf(path, vocab_size=2048, hidden=256, layers=4):
    """A stand-in for llama.cpp's conversion of the fixture target: its metadata and a vocabulary, no tensors."""
    writer = GGUFWriter(str(path), "qwen3")
    writer.add_uint32("qwen3.embedding_length", hidden)
    writer.add_uint32("qwen3.block_count", layers)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab_size)])
    writer.add_array("tokenizer.ggml.merges", ["t1 t2"])
    writer.add_uint32("tokenizer.ggml.eos_token_id", 0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_writes_llamacpps_dflash_layout(tmp_path):
    out = export_gguf(fixtures.drafter_dir("parallel"), tmp_path / "out", _target_gguf(tmp_path / "t.gguf"))
    reader = GGUFReader(str(out / DRAFTER_FILE))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    config = json.loads((fixtures.drafter_dir("parallel") / "config.json").read_text())
    assert fields["general.architecture"] == "dflash"
    assert fields["dflash.target_layers"] == [i + 1 for i in config["target_layer_ids"]]  # input of layer i + 1
    assert fields["dflash.block_size"] == config["block_size"]
    assert fields["dflash.attention.causal"] is False
    assert fields["tokenizer.ggml.mask_token_id"] == config["mask_token_id"]
    assert fields["tokenizer.ggml.tokens"][:3] == ["t0", "t1", "t2"]  # the target GGUF's vocabulary, verbatim
    weights = load_file(str(fixtures.drafter_dir("parallel") / "model.safetensors"))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert np.array_equal(tensors["fc.weight"], weights["fc.weight"].float().numpy())
    assert np.array_equal(tensors["blk.1.attn_q.weight"], weights["layers.1.self_attn.q_proj.weight"].float().numpy())
    assert "output.weight" not in tensors and "d2t" not in tensors  # full vocabulary: the target's head is used


def test_draft_vocabulary_ships_d2t_and_its_head_rows(tmp_path):
    from portable_spec.core.drafter import target_ids_of
    from portable_spec.core.target import TargetModel
    from portable_spec.core.testing import tiny_drafter, tiny_target

    target = tiny_target(seed=0)
    target.model.save_pretrained(tmp_path / "target")
    drafter = tiny_drafter(target, "parallel", draft_vocab_size=64)
    drafter.save(tmp_path / "drafter")
    loaded = TargetModel.load(tmp_path / "target")
    target_gguf = _target_gguf(tmp_path / "t.gguf", loaded.vocab_size, loaded.config.hidden_size,
                               loaded.config.num_hidden_layers)  # fmt: skip
    out = export_gguf(tmp_path / "drafter", tmp_path / "out", target_gguf, tmp_path / "target")
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(str(out / DRAFTER_FILE)).tensors}
    ids = target_ids_of(load_file(str(tmp_path / "drafter" / "model.safetensors"))["d2t"])
    assert np.array_equal(tensors["d2t"], ids.numpy())  # absolute target ids, not EAGLE-3 offsets
    head = loaded.model.get_output_embeddings().weight.detach()[ids]
    assert np.array_equal(tensors["output.weight"], head.numpy())


@pytest.mark.parametrize(
    "kind, needle",
    [
        ("depth_causal", "shift-mix"),
        ("autoregressive", "one drafter pass per round"),
        ("domino", "b11434 has no Domino head"),
        ("dflash2", "selector_top_k=16 needs hidden_size >= 272 .* lower variant.selector_top_k"),
    ],
)
def test_refuses_kinds_llamacpp_cannot_run(tmp_path, kind, needle):
    with pytest.raises(SpecError, match=needle):
        export_gguf(fixtures.drafter_dir(kind), tmp_path / "out", _target_gguf(tmp_path / "t.gguf"))
    assert not (tmp_path / "out").exists()


def _resaved(tmp_path, kind: str, **variant) -> object:
    """The trained fixture drafter of `kind` saved again with `variant` fields changed (weights unchanged)."""
    from portable_spec.core.target import TargetModel

    drafter = TargetModel.load(fixtures.target_dir()).load_drafter(fixtures.drafter_dir(kind))
    config = drafter.config
    drafter.config = config.model_copy(update={"variant": config.variant.model_copy(update=variant)})
    return drafter.save(tmp_path / f"{kind}-resaved")


def test_dflash2_writes_its_convolutions_selector_and_switches(tmp_path):
    """b11434's names (llama-arch.cpp LLM_TENSOR_DFLASH_*; equality with llama.cpp's own converter:
    tests/engines/test_llamacpp.py): the four convolution tensors per layer, the selector's three, its four keys."""
    drafter = _resaved(tmp_path, "dflash2", selector_top_k=8)  # 8 x 9 <= 256: the lattice fits a 256-wide row
    out = export_gguf(drafter, tmp_path / "out", _target_gguf(tmp_path / "t.gguf"))
    reader = GGUFReader(str(out / DRAFTER_FILE))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert (fields["dflash.selector_top_k"], fields["dflash.selector_rank"]) == (8, 256)
    assert (fields["dflash.conv_kernel_size"], fields["dflash.conv_group_size"]) == (2, 16)
    weights = load_file(str(drafter / "model.safetensors"))
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    pairs = {
        "blk.0.attn_conv_base": "layers.0.attention_conv.base_kernel",
        "blk.1.ffn_conv_proj.weight": "layers.1.mlp_conv.kernel_projection.weight",
        "selector_predecessor.weight": "candidate_selector.predecessor_codebook",
        "selector_hidden.weight": "candidate_selector.hidden_projection.weight",
    }
    for ours, portable in pairs.items():
        assert np.array_equal(tensors[ours], weights[portable].float().numpy()), ours
    assert json.loads((out / "portable_spec_gguf.json").read_text())["serve"].endswith("--spec-draft-n-max 15")


def test_dspark_writes_its_markov_and_confidence_heads(tmp_path):
    out = export_gguf(fixtures.drafter_dir("dspark"), tmp_path / "out", _target_gguf(tmp_path / "t.gguf"))
    reader = GGUFReader(str(out / DRAFTER_FILE))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["dflash.sample_from_anchor"] is True and fields["dflash.has_confidence_head"] is True
    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    weights = load_file(str(fixtures.drafter_dir("dspark") / "model.safetensors"))
    assert np.array_equal(tensors["markov_w1.weight"], weights["markov_head.markov_w1.weight"].float().numpy())
    assert np.array_equal(tensors["conf_proj.bias"], weights["confidence_head.proj.bias"].float().numpy())
    manifest = json.loads((out / "portable_spec_gguf.json").read_text())
    assert "--spec-type draft-dspark --spec-draft-n-max 16" in manifest["serve"]  # the anchor's slot drafts too


@pytest.mark.parametrize(
    "variant, needle",
    [
        ({"markov_head_type": "gated"}, "markov_head_type=gated: llama.cpp b11434 runs the vanilla Markov head only"),
        ({"confidence_head_with_markov": False}, "confidence_head_with_markov=false"),
    ],
)
def test_refuses_dspark_heads_llamacpp_cannot_run(tmp_path, variant, needle):
    from portable_spec.core.testing import tiny_drafter, tiny_target

    target = tiny_target(seed=0)
    tiny_drafter(target, "dspark", variant_options={"markov_rank": 8, **variant}).save(tmp_path / "drafter")
    with pytest.raises(SpecError, match=needle):
        export_gguf(tmp_path / "drafter", tmp_path / "out", _target_gguf(tmp_path / "t.gguf", 256, 64, 2))
    assert not (tmp_path / "out").exists()


def test_refuses_another_targets_gguf(tmp_path):
    with pytest.raises(SpecError, match="hidden_size=512"):
        export_gguf(fixtures.drafter_dir("parallel"), tmp_path / "out", _target_gguf(tmp_path / "t.gguf", hidden=512))
    with pytest.raises(SpecError, match="not a readable GGUF"):
        (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
        export_gguf(fixtures.drafter_dir("parallel"), tmp_path / "out", tmp_path / "junk.gguf")
    assert not (tmp_path / "out").exists()


def test_cli_needs_a_target_gguf_for_an_unknown_target(tmp_path, capsys):
    from portable_spec.cli import main

    code = main(["export", "gguf", str(fixtures.drafter_dir("parallel")), str(tmp_path / "out"), "--target", "fixture"])
    assert code != 0
    assert "--target-gguf: required" in capsys.readouterr().err
