"""YaRN rotary scaling: the drafter's cos/sin are transformers' Qwen3 ones, the config carries them to engines as
`rope_parameters`, decoding stays lossless, ONNX computes the same, and upstream YaRN drafters import."""

import json

import pytest
import torch
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.drafter import Drafter
from portable_spec.core.drafter_layers import rotary_cos_sin
from portable_spec.core.spec import SpecError, parse_config
from portable_spec.core.testing import tiny_drafter, tiny_target

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def _yarn_drafter(target, kind="parallel", **scaling):
    config = tiny_drafter(target, kind).config
    data = {**config.to_json_dict(), "rope_scaling": {**YARN, **scaling}}
    data.pop("rope_parameters")
    drafter = target.bind(Drafter(parse_config(data)))
    drafter.load_state_dict(tiny_drafter(target, kind).state_dict())
    return drafter.eval()


@pytest.mark.parametrize("scaling", [{}, {"attention_factor": 1.3, "beta_fast": 16.0}])
def test_cos_sin_are_transformers_qwen3_ones(target, scaling):
    drafter = _yarn_drafter(target, **scaling)
    config = drafter.config
    hf = Qwen3Config(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        head_dim=config.head_dim,
        max_position_embeddings=32768,
        rope_parameters=config.rope_parameters(),
    )
    positions = torch.tensor([[0, 5, 63, 64, 300, 2000]])
    hf_cos, hf_sin = Qwen3RotaryEmbedding(hf)(torch.zeros(1, 1, dtype=torch.float32), positions)
    cos, sin = rotary_cos_sin(positions, config.head_dim, config.rope_theta, torch.float32, drafter.rotary)
    torch.testing.assert_close(cos[:, 0], hf_cos, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(sin[:, 0], hf_sin, atol=1e-6, rtol=1e-6)
    plain = rotary_cos_sin(positions, config.head_dim, config.rope_theta, torch.float32)
    assert (plain[0] - cos).abs().max() > 1e-2  # the scaling changes something


def test_engine_keys_and_refusals(target):
    drafter = _yarn_drafter(target)
    data = json.loads(json.dumps(drafter.config.to_json_dict()))
    theta = drafter.config.rope_theta
    assert data["rope_parameters"] == {**YARN, "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": theta}
    assert parse_config(data) == drafter.config
    plain = tiny_drafter(target, "parallel").config.to_json_dict()
    assert plain["rope_parameters"] == {"rope_type": "default", "rope_theta": plain["rope_theta"]}
    with pytest.raises(SpecError, match="rope_parameters = .*contradicts"):
        parse_config({**plain, "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}})
    for bad, pattern in (
        ({"rope_type": "longrope", "factor": 2.0}, "rope_scaling"),
        ({**YARN, "factor": -1.0}, "factor"),
        ({**YARN, "mscale": 1.0}, "mscale"),
    ):
        fields = {key: value for key, value in plain.items() if key != "rope_parameters"}
        with pytest.raises(SpecError, match=pattern):
            parse_config({**fields, "rope_scaling": bad})


@pytest.mark.parametrize("kind", ["parallel", "depth_causal"])
def test_decoding_past_the_original_length_is_lossless(target, kind):
    drafter = _yarn_drafter(target, kind)
    prompts = [list(range(3, 80)), list(range(100, 130))]  # past original_max_position_embeddings=64
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=7)
    assert (
        SpeculativeDecoder(target, drafter).generate(prompts, config).tokens
        == SpeculativeDecoder(target, None).generate(prompts, config).tokens
    )


def test_onnx_graph_scales_the_same(tmp_path, target):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from portable_spec.adapters.onnx import OnnxBackend
    from portable_spec.adapters.onnx_export import export_onnx
    from portable_spec.core.backends import ReferenceBackend

    target.model.save_pretrained(tmp_path / "target")
    drafter_dir = _yarn_drafter(target).save(tmp_path / "drafter")
    graph = export_onnx(drafter_dir, tmp_path / "target", tmp_path / "graph")
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 90, 128, generator=generator)
    positions = torch.arange(90).expand(2, -1).clone()
    valid = torch.ones(2, 90, dtype=torch.bool)
    block_ids = torch.randint(0, 250, (2, 1, 8), generator=generator)
    block_positions = (90 + torch.arange(8)).expand(2, 1, 8).clone()
    inputs = (features, positions, valid, block_ids, block_positions)
    expected = ReferenceBackend().block_logits(tmp_path / "target", drafter_dir, *inputs)
    assert (OnnxBackend().block_logits(tmp_path / "target", graph, *inputs) - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("layout", ["zlab", "specforge", "speculators"])
def test_yarn_drafters_import_from_each_layout_and_export_back(tmp_path, target, layout):
    from portable_spec.adapters.upstream.importer import import_drafter
    from portable_spec.adapters.upstream.speculators import export_speculators
    from portable_spec.conformance.upstream_layouts import write_portable_as_upstream
    from portable_spec.core.spec import read_config

    target.model.save_pretrained(tmp_path / "target")
    drafter_dir = _yarn_drafter(target).save(tmp_path / "drafter")
    upstream = write_portable_as_upstream(layout, tmp_path / layout, drafter_dir, tmp_path / "target")
    imported = import_drafter(upstream, tmp_path / "target", tmp_path / "imported").out
    assert read_config(imported).rope_scaling == read_config(drafter_dir).rope_scaling
    back = import_drafter(
        export_speculators(imported, tmp_path / "spec", tmp_path / "target"), tmp_path / "target", tmp_path / "back"
    ).out
    assert read_config(back).rope_scaling == read_config(drafter_dir).rope_scaling


def test_legacy_rope_scaling_key_and_yarn_refusals(tmp_path, target):
    from portable_spec.adapters.upstream.layouts import read_upstream
    from portable_spec.conformance.upstream_layouts import write_portable_as_upstream

    target.model.save_pretrained(tmp_path / "target")
    plain = tiny_drafter(target, "parallel").save(tmp_path / "drafter")
    out = write_portable_as_upstream("zlab", tmp_path / "z", plain)
    data = json.loads((out / "config.json").read_text())
    theta = data["rope_parameters"]["rope_theta"]

    def read(**change):
        (out / "config.json").write_text(json.dumps({**data, **change}))
        return read_upstream(out).fields.get("rope_scaling")

    legacy = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert read(rope_scaling=legacy) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    no_factor = {"rope_type": "yarn", "rope_theta": theta, "original_max_position_embeddings": 8192}
    assert read(rope_parameters=no_factor)["factor"] == 32768 / 8192  # transformers: max / original
    for change, pattern in (
        (
            {"rope_parameters": {**no_factor, "factor": 2.0, "mscale": 0.7}},
            r"rope_parameters\.mscale = 0\.7 is a YaRN option",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": theta}},
            r"rope_type = \"longrope\" is not plain or YaRN",
        ),
        ({"rope_scaling": {"type": "yarn", "factor": 2.0}}, r"original_max_position_embeddings = null must be"),
    ):
        with pytest.raises(SpecError, match=pattern):
            read(**change)
