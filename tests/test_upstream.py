"""Upstream DFlash checkpoints: z-lab/dflash, SpecForge and speculators layouts import exactly (written by
conformance/upstream_layouts.py, independently of our writers), and `export speculators` round-trips. The import
refusals are cases of tests/test_bad_inputs.py; tokens and acceptance through each backend are the conformance
suite's import/* checks."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from portable_spec.adapters.upstream.importer import import_drafter
from portable_spec.adapters.upstream.layouts import read_upstream
from portable_spec.adapters.upstream.speculators import export_speculators
from portable_spec.conformance.upstream_layouts import READ_AS, UPSTREAM_LAYOUTS, write_portable_as_upstream
from portable_spec.core import fixtures
from portable_spec.core.checkpoint import load_drafter_files, save_drafter
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import DrafterConfig, SpecError, read_config
from portable_spec.core.target import TargetModel

PARALLEL = fixtures.drafter_dir("parallel")
TARGET = fixtures.target_dir()


def _same_checkpoint(a, b) -> None:
    """Same fields and weights; the binding's model_id is the verifier the checkpoint names, else the target path."""
    (config_a, weights_a), (config_b, weights_b) = load_drafter_files(a), load_drafter_files(b)
    unnamed = config_a.target.model_copy(update={"model_id": config_b.target.model_id})
    assert config_a.model_copy(update={"target": unnamed}) == config_b
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)


@pytest.mark.parametrize("layout", UPSTREAM_LAYOUTS)
def test_each_upstream_layout_imports_exactly(layout, tmp_path):
    upstream = write_portable_as_upstream(layout, tmp_path / layout, PARALLEL, TARGET)
    assert read_upstream(upstream).layout == READ_AS[layout]
    result = import_drafter(upstream, TARGET, tmp_path / "imported")
    _same_checkpoint(result.out, PARALLEL)  # the binding included: model_id is the verifier the checkpoint names


FIVE = ["sliding_attention"] * 4 + ["full_attention"]


def _five_layer_parallel(tmp_path):
    """The parallel fixture's weights under a 5-layer config (layers 2-4 copies of 0-1), the shape of z-lab's
    Qwen3.6-27B drafter: 4 sliding layers and 1 full."""
    config, weights = load_drafter_files(PARALLEL)
    for index in range(config.num_hidden_layers, 5):
        source = index % config.num_hidden_layers
        for name in [n for n in weights if n.startswith(f"layers.{source}.")]:
            weights[name.replace(f"layers.{source}.", f"layers.{index}.", 1)] = weights[name].clone()
    five = DrafterConfig.model_validate({**config.model_dump(), "num_hidden_layers": 5})
    return save_drafter(tmp_path / "five", five, weights)


@pytest.mark.parametrize(
    "layout,layer_types,upstream,block_attention",
    [
        # speculators' trainer default: every layer slides, sliding_window_non_causal false -> causal block
        ("speculators", ["sliding_attention"] * 5, {}, "causal"),
        (
            "speculators",
            FIVE,
            {},
            "causal_in_sliding_layers",
        ),  # --full-attention-indices 4: full layers stay bidirectional
        ("speculators", FIVE, {"sliding_window_non_causal": True}, "bidirectional"),
        ("zlab", FIVE, {}, "causal_in_sliding_layers"),  # no is_causal: causal exactly in the sliding layers
        ("zlab", FIVE, {"is_causal": False}, "bidirectional"),  # as z-lab's dflash2 fixture
        ("zlab", FIVE, {"is_causal": True}, "causal"),
    ],
)
def test_sliding_window_layouts_import_as_upstream_reads_them(tmp_path, layout, layer_types, upstream, block_attention):
    """Sliding layers, their window and the block causality each upstream reads come over exactly; the weights
    are the same tensors."""
    five = _five_layer_parallel(tmp_path)
    out = write_portable_as_upstream(
        layout, tmp_path / layout, five, TARGET, layer_types=layer_types, sliding_window=64, **upstream
    )
    result = import_drafter(out, TARGET, tmp_path / "imported")
    config = read_config(result.out)
    assert config.layer_types == layer_types and config.sliding_window == 64
    assert config.variant.block_attention == block_attention
    imported, original = load_file(str(result.out / "model.safetensors")), load_file(str(five / "model.safetensors"))
    assert all(torch.equal(imported[name], original[name]) for name in original)


def test_implicit_use_sliding_window_follows_transformers(tmp_path):
    """No layer_types, use_sliding_window true: transformers' Qwen3Config makes layers >= max_window_layers slide
    (default 28: none of a 5-layer drafter's) with sliding_window (default 4096)."""
    five = _five_layer_parallel(tmp_path)
    out = write_portable_as_upstream("zlab", tmp_path / "z", five)
    data = json.loads((out / "config.json").read_text())
    data.pop("layer_types")
    data.update(use_sliding_window=True, max_window_layers=3)
    data.pop("sliding_window", None)
    (out / "config.json").write_text(json.dumps(data))
    config = read_config(import_drafter(out, TARGET, tmp_path / "three").out)
    assert config.layer_types == ["full_attention"] * 3 + ["sliding_attention"] * 2
    assert config.sliding_window == 4096 and config.variant.block_attention == "causal_in_sliding_layers"
    data.pop("max_window_layers")
    (out / "config.json").write_text(json.dumps(data))
    config = read_config(import_drafter(out, TARGET, tmp_path / "none").out)
    assert config.layer_types is None and config.sliding_window is None


def test_sliding_layers_without_use_sliding_window_are_refused(tmp_path):
    """transformers drops sliding_window unless use_sliding_window: vLLM and SGLang refuse such a config."""
    out = write_portable_as_upstream(
        "zlab", tmp_path / "z", _five_layer_parallel(tmp_path), layer_types=FIVE, sliding_window=64
    )
    data = json.loads((out / "config.json").read_text())
    data["use_sliding_window"] = False
    (out / "config.json").write_text(json.dumps(data))
    with pytest.raises(SpecError, match="use_sliding_window = false with sliding_attention layers"):
        read_upstream(out)


def test_block_size_in_dflash_config_wins_as_in_zlab(tmp_path):
    """z-lab's model.py reads each DFlash key from dflash_config first (`_draft_value`)."""
    out = write_portable_as_upstream("zlab", tmp_path / "z", PARALLEL)
    data = json.loads((out / "config.json").read_text())
    data["block_size"] = data["dflash_config"]["block_size"] + 4
    (out / "config.json").write_text(json.dumps(data))
    assert read_upstream(out).fields["block_size"] == read_config(PARALLEL).block_size


@pytest.mark.parametrize(
    "layer_types,block_attention,non_causal",
    [(["sliding_attention"] * 5, "causal", False), (FIVE, "bidirectional", True), (None, "bidirectional", True)],
)
def test_speculators_export_of_windowed_drafters_round_trips(tmp_path, layer_types, block_attention, non_causal):
    config, weights = load_drafter_files(_five_layer_parallel(tmp_path))
    data = {**config.model_dump(), "variant": {"kind": "parallel", "block_attention": block_attention}}
    if layer_types:  # speculators' trainer windows per anchor: the one rule its format can carry
        data.update(layer_types=layer_types, sliding_window=64, window_rule="per_anchor")
    drafter = save_drafter(tmp_path / "windowed", DrafterConfig.model_validate(data), weights)
    out = export_speculators(drafter, tmp_path / "spec", TARGET)
    exported = json.loads((out / "config.json").read_text())
    assert exported["sliding_window_non_causal"] is non_causal
    _same_checkpoint(import_drafter(out, TARGET, tmp_path / "back").out, drafter)


def test_speculators_export_of_a_dflash2_drafter_round_trips(tmp_path):
    """dflash2 is written as speculators' DFlash2 layout (its four keys at the top level, blocks bidirectional) and
    imported back as the same checkpoint; that speculators' own classes read it is the upstream stage's
    test_export_speculators_is_read_by_speculators_own_classes."""
    drafter = fixtures.drafter_dir("dflash2")
    out = export_speculators(drafter, tmp_path / "spec", TARGET)
    exported = json.loads((out / "config.json").read_text())
    assert exported["speculators_model_type"] == "dflash2" and exported["selector_top_k"] == 16
    assert exported["sliding_window_non_causal"] is True
    _same_checkpoint(import_drafter(out, TARGET, tmp_path / "back").out, drafter)


def test_speculators_export_refuses_per_slot_windows(tmp_path):
    """A per-slot window written as speculators would be read back (and trained on) per anchor: refused by name."""
    config, weights = load_drafter_files(_five_layer_parallel(tmp_path))
    data = {**config.model_dump(), "layer_types": ["sliding_attention"] * 5, "sliding_window": 64}
    data["variant"] = {"kind": "parallel", "block_attention": "causal"}
    drafter = save_drafter(tmp_path / "per_slot", DrafterConfig.model_validate(data), weights)
    with pytest.raises(SpecError, match="window_rule=per_slot .* cannot be written in the speculators format"):
        export_speculators(drafter, tmp_path / "spec", TARGET)
    assert not (tmp_path / "spec").exists()


def test_speculators_export_refuses_a_causal_block_with_full_layers(tmp_path):
    config, weights = load_drafter_files(_five_layer_parallel(tmp_path))
    data = {**config.model_dump(), "layer_types": FIVE, "sliding_window": 64, "window_rule": "per_anchor"}
    data["variant"] = {"kind": "parallel", "block_attention": "causal_in_sliding_layers"}
    drafter = save_drafter(tmp_path / "mixed", DrafterConfig.model_validate(data), weights)
    with pytest.raises(SpecError, match="full layers bidirectional in speculators and causal in vLLM"):
        export_speculators(drafter, tmp_path / "spec", TARGET)
    assert not (tmp_path / "spec").exists()


def test_speculators_layer_ids_are_counted_one_higher(tmp_path):
    upstream = write_portable_as_upstream("speculators", tmp_path / "s", PARALLEL, TARGET)
    aux = json.loads((upstream / "config.json").read_text())["aux_hidden_state_layer_ids"]
    assert (
        read_upstream(upstream).fields["target_layer_ids"]
        == [i - 1 for i in aux]
        == read_config(PARALLEL).target_layer_ids
    )


def test_sharded_and_prefixed_weights_import(tmp_path):
    """A sharded save (model.safetensors.index.json) whose names carry a `model.` prefix."""
    upstream = write_portable_as_upstream("zlab", tmp_path / "z", PARALLEL)
    weights = load_file(str(upstream / "model.safetensors"))
    (upstream / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({f"model.{name}": weights[name] for name in part}, str(upstream / file), {"format": "pt"})
    index = {"weight_map": {f"model.{name}": file for file, part in shards.items() for name in part}}
    (upstream / "model.safetensors.index.json").write_text(json.dumps(index))
    _same_checkpoint(import_drafter(upstream, TARGET, tmp_path / "imported").out, PARALLEL)


def test_speculators_export_round_trips(tmp_path):
    with pytest.raises(SpecError, match="ships its target's embed_tokens and lm_head .*pass --target"):
        export_speculators(PARALLEL, tmp_path / "no-target")
    out = export_speculators(PARALLEL, tmp_path / "spec", TARGET)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["sliding_window_non_causal"] is True
    shipped, target = load_file(str(out / "model.safetensors")), TargetModel.load(TARGET).model
    assert torch.equal(shipped["embed_tokens.weight"], target.get_input_embeddings().weight.detach())
    assert torch.equal(shipped["lm_head.weight"], target.get_output_embeddings().weight.detach())  # self-contained
    _same_checkpoint(import_drafter(out, TARGET, tmp_path / "back").out, PARALLEL)


def _reduced_vocabulary(tmp_path):
    """The parallel fixture with a 512-id draft vocabulary (EAGLE-3 layout: target id = draft id + d2t)."""
    config, weights = load_drafter_files(PARALLEL)
    ids = torch.randperm(config.vocab_size, generator=torch.Generator().manual_seed(0))[:512].sort().values
    weights["d2t"] = ids - torch.arange(512)
    reduced = DrafterConfig.model_validate({**config.model_dump(), "draft_vocab_size": 512})
    return save_drafter(tmp_path / "reduced", reduced, weights), ids


def test_draft_vocabulary_exports_its_head_rows_and_imports_back(tmp_path):
    reduced, ids = _reduced_vocabulary(tmp_path)
    with pytest.raises(SpecError, match="pass --target"):
        export_speculators(reduced, tmp_path / "no-target")
    out = export_speculators(reduced, tmp_path / "spec", TARGET)
    weights = load_file(str(out / "model.safetensors"))
    head = TargetModel.load(TARGET).model.get_output_embeddings().weight.detach()
    assert torch.equal(weights["lm_head.weight"], head[ids])
    assert weights["t2d"].nonzero()[:, 0].tolist() == ids.tolist()
    _same_checkpoint(import_drafter(out, TARGET, tmp_path / "back").out, reduced)


def test_a_head_that_is_not_the_targets_becomes_the_drafters_own(tmp_path):
    """A same-width drafter trained with its own head imports with own_embeddings (the target's embedding copied
    beside it), as vLLM serves it: it keeps a head that differs from the target's."""
    reduced, ids = _reduced_vocabulary(tmp_path)
    out = export_speculators(reduced, tmp_path / "spec", TARGET)
    weights = load_file(str(out / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"] + 1.0
    del weights["embed_tokens.weight"]
    save_file(weights, str(out / "model.safetensors"), {"format": "pt"})
    imported = import_drafter(out, TARGET, tmp_path / "back").out
    config, own = load_drafter_files(imported)
    target = TargetModel.load(TARGET)
    assert config.own_embeddings and config.hidden_size == target.config.hidden_size
    assert torch.equal(own["lm_head.weight"], weights["lm_head.weight"])
    assert torch.equal(own["embed_tokens.weight"], target.model.get_input_embeddings().weight.detach())
    prompts = [list(range(3, 20))]
    generation = GenerationConfig(max_new_tokens=12, num_draft_tokens=3)
    drafted = SpeculativeDecoder(target, target.load_drafter(imported)).generate(prompts, generation)
    assert drafted.tokens == SpeculativeDecoder(target).generate(prompts, generation).tokens


def test_a_head_of_another_shape_is_refused(tmp_path):
    reduced, _ = _reduced_vocabulary(tmp_path)
    out = export_speculators(reduced, tmp_path / "spec", TARGET)
    weights = load_file(str(out / "model.safetensors"))
    weights["lm_head.weight"] = weights["lm_head.weight"][:-1]
    save_file(weights, str(out / "model.safetensors"), {"format": "pt"})
    with pytest.raises(
        SpecError, match=r"weight lm_head\.weight has shape \(511, 256\), config.json implies \(512, 256\)"
    ):
        import_drafter(out, TARGET, tmp_path / "back")
    assert not (tmp_path / "back").exists()


def _key_paths(obj: dict, prefix: tuple = ()):
    for key, value in obj.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _key_paths(value, (*prefix, key))


@pytest.mark.parametrize("layout", UPSTREAM_LAYOUTS)
def test_every_wrongly_typed_config_key_is_named(layout, tmp_path):
    """Each key the reader uses, set to a value of another JSON type, is refused naming the key (never an
    AttributeError or TypeError from deep inside the reader)."""
    from portable_spec.adapters.upstream.layouts import KEY_TYPES

    upstream = write_portable_as_upstream(layout, tmp_path / layout, PARALLEL, TARGET)
    config = json.loads((upstream / "config.json").read_text())
    tried = 0
    for path in list(_key_paths(config)):
        if path[-1] not in KEY_TYPES:
            continue
        for wrong in ("x", [1], {"a": 1}, 1.5, True):
            if KEY_TYPES[path[-1]][0](wrong):
                continue  # a value of the right type
            changed = json.loads(json.dumps(config))
            node = changed
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = wrong
            (upstream / "config.json").write_text(json.dumps(changed))
            with pytest.raises(SpecError, match=rf"{'.'.join(path)} = .* must be"):
                read_upstream(upstream)
            tried += 1
    assert tried >= 40


@pytest.mark.parametrize(
    "layout,layer_types,block_attention",
    [
        ("zlab", FIVE, "causal_in_sliding_layers"),
        ("zlab", FIVE, "bidirectional"),
        ("zlab", FIVE, "causal"),
        ("specforge", FIVE, "causal_in_sliding_layers"),
        ("speculators", ["sliding_attention"] * 5, "causal"),
        ("speculators", FIVE, "bidirectional"),
    ],
)
def test_portable_layer_options_written_upstream_come_back(tmp_path, layout, layer_types, block_attention):
    """The test writers lay a portable drafter's windows and block attention out in upstream keys (what the
    conformance layers/* checks hand the engines): importing the file gives the drafter back."""
    config, weights = load_drafter_files(_five_layer_parallel(tmp_path))
    data = {**config.model_dump(), "layer_types": layer_types, "sliding_window": 64}
    data["variant"] = {"kind": "parallel", "block_attention": block_attention}
    if layout == "speculators":  # its trainer's windows, what the import reads from that layout
        data["window_rule"] = "per_anchor"
    drafter = save_drafter(tmp_path / "windowed", DrafterConfig.model_validate(data), weights)
    out = write_portable_as_upstream(layout, tmp_path / layout, drafter, TARGET)
    _same_checkpoint(import_drafter(out, TARGET, tmp_path / "back").out, drafter)
