"""Spec validation: every bad config is refused with a message naming the field and the fix."""

import json

import pytest
import torch

from portable_spec.core.checkpoint import save_drafter
from portable_spec.core.drafter import WeightCheck, load_drafter
from portable_spec.core.spec import SpecError, parse_config, read_config
from portable_spec.core.testing import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def good(target):
    return tiny_drafter(target, "depth_causal").config.to_json_dict()


def _with(config: dict, path: str, value):
    out = json.loads(json.dumps(config))
    node = out
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return out


_DELETE = object()

BAD_CONFIGS = [
    # (path, value, words the message must contain)
    ("variant", {"kind": "diffusion"}, ["variant", "parallel, depth_causal, autoregressive"]),
    ("block_size", 1, ["block_size", "greater than or equal to 2"]),
    ("block_size", 65, ["block_size", "less than or equal to 64"]),
    ("num_key_value_heads", 3, ["num_key_value_heads=3", "divisor"]),
    ("head_dim", 33, ["head_dim=33", "even"]),
    ("mask_token_id", 10_000, ["mask_token_id=10000", "vocab_size"]),
    ("vocab_size", 300, ["vocab_size=300", "target.vocab_size"]),
    ("hidden_size", 128, ["hidden_size=128", "target.hidden_size"]),
    ("target_layer_ids", [1, 0], ["target_layer_ids", "increasing"]),
    ("target_layer_ids", [0, 2], ["target_layer_ids=[0, 2]", "[0, 1]", "last layer"]),
    ("target_layer_ids", [], ["target_layer_ids", "at least 1"]),
    ("target.fingerprint", "md5:abc", ["target.fingerprint", "sha256"]),
    ("blocksize", 8, ["blocksize", "unknown field", "block_size"]),
    ("num_hidden_layers", _DELETE, ["num_hidden_layers", "Field required"]),
    ("format_version", 2, ["format_version", "1"]),
    ("dflash_config.block_size", 4, ["dflash_config", "contradicts", "block_size"]),
    ("architectures", ["DFlashDraftModel"], ["architectures", "contradicts"]),
]


@pytest.mark.parametrize("path,value,words", BAD_CONFIGS, ids=[f"{p}={v!r}"[:40] for p, v, _ in BAD_CONFIGS])
def test_bad_config_is_refused_naming_the_field(good, path, value, words):
    with pytest.raises(SpecError) as error:
        parse_config(_with(good, path, value), "config.json")
    message = str(error.value)
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"


def test_good_config_round_trips(good, target, tmp_path):
    drafter = tiny_drafter(target, "depth_causal")
    drafter.save(tmp_path / "d")
    assert read_config(tmp_path / "d").to_json_dict() == good
    from transformers import AutoConfig  # engines read the same file through HF AutoConfig

    hf = AutoConfig.from_pretrained(tmp_path / "d")
    assert hf.architectures == ["DFlashDepthCausalDraftModel"] and hf.dflash_config["block_size"] == 8
    again = load_drafter(tmp_path / "d")
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_checkpoint_holds_no_target_weights(target, tmp_path):
    tiny_drafter(target, "parallel").save(tmp_path / "d")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "d" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "fc.weight" in names and not any("embed" in n or "lm_head" in n for n in names)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match="JSON object"):
        read_config(tmp_path)


def test_missing_layer_weights_are_named(target, tmp_path):
    drafter = tiny_drafter(target, "depth_causal")
    weights = {k: v for k, v in drafter.state_dict().items() if not k.startswith("layers.1.")}
    save_drafter(tmp_path / "d", drafter.config, weights)
    with pytest.raises(SpecError, match=r"lacks 12 weight\(s\) a depth_causal drafter .* needs: \['layers\.1\."):
        load_drafter(tmp_path / "d")


def test_weight_check_follows_a_stream(target):
    """An engine's loader streams (name, tensor) pairs: unknown names and wrong shapes are refused as they pass,
    before the rest is read; missing ones when the stream ends."""
    config = tiny_drafter(target, "depth_causal").config
    check = WeightCheck(config, "stream")
    for name, shape in check.expected.items():
        if name != "layers.1.shift_mix.weight":
            check.see(name, shape)
    with pytest.raises(SpecError, match=r"lacks 1 weight.*\['layers\.1\.shift_mix\.weight'\]"):
        check.finish()
    with pytest.raises(SpecError, match="'lm_head.weight' is not part of a depth_causal drafter"):
        check.see("lm_head.weight", (256, 64))
    with pytest.raises(SpecError, match=r"fc\.weight has shape \(1, 2\)"):
        check.see("fc.weight", (1, 2))


def test_weights_of_another_variant_are_refused(target, tmp_path):
    parallel = tiny_drafter(target, "parallel")
    depth = tiny_drafter(target, "depth_causal")
    save_drafter(tmp_path / "d", depth.config, parallel.state_dict())
    with pytest.raises(SpecError, match="shift_mix"):
        load_drafter(tmp_path / "d")


def test_failed_save_leaves_nothing_on_disk(target, tmp_path):
    drafter = tiny_drafter(target, "parallel")
    bad = {
        "fc.weight": drafter.fc.weight,
        "alias": drafter.fc.weight[:, :4],
    }  # non-contiguous view fails? no: made contiguous
    bad["not_a_tensor"] = object()
    with pytest.raises(Exception):
        save_drafter(tmp_path / "out", drafter.config, bad)
    assert list(tmp_path.iterdir()) == []


def test_overlong_block_is_refused(target):
    drafter = tiny_drafter(target, "depth_causal", block_size=4)
    with pytest.raises(SpecError, match=r"num_draft_tokens=4 does not fit block_size=4: use 1\.\.3"):
        drafter.config.check_num_draft_tokens(4)
