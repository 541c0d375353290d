"""A drafter trained for another target is refused at load time, naming what differs; a pair is checked once,
where it is bound (TargetModel.bind), and the decoder takes only drafters bound to its own target."""

import pytest
import torch

from portable_spec.core import binding
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.drafter import load_drafter
from portable_spec.core.spec import SpecError
from portable_spec.core.testing import tiny_drafter, tiny_target


def test_drafter_for_another_target_is_refused(tmp_path):
    mine, other = tiny_target(seed=0), tiny_target(seed=1)
    tiny_drafter(mine, "depth_causal").save(tmp_path / "d")
    mine.load_drafter(tmp_path / "d")  # fine
    with pytest.raises(SpecError) as error:
        other.load_drafter(tmp_path / "d")
    assert "fingerprint" in str(error.value) and "portable-spec train" in str(error.value)


def test_mismatched_shapes_are_listed(tmp_path):
    tiny_drafter(tiny_target(), "parallel").save(tmp_path / "d")
    wider = tiny_target(hidden_size=128, num_hidden_layers=4, vocab_size=300)
    with pytest.raises(SpecError) as error:
        wider.load_drafter(tmp_path / "d")
    message = str(error.value)
    for field in (
        "hidden_size: drafter expects 64",
        "num_hidden_layers: drafter expects 3",
        "vocab_size: drafter expects 256",
    ):
        assert field in message


def test_fingerprint_ignores_load_dtype():
    target = tiny_target()
    before = target.fingerprint
    target.model.to(torch.bfloat16)
    del target.__dict__["fingerprint"]
    rounded_once = target.fingerprint
    target.model.to(torch.float32)
    del target.__dict__["fingerprint"]
    assert target.fingerprint == rounded_once
    assert before == rounded_once  # rounding to bf16 first makes fp32 and bf16 loads agree


def test_decoder_refuses_a_drafter_bound_to_another_target():
    drafter = tiny_drafter(tiny_target(seed=0), "parallel")
    with pytest.raises(SpecError, match="not bound to target"):
        SpeculativeDecoder(tiny_target(seed=1), drafter)


def test_decoder_refuses_a_drafter_loaded_without_its_target(tmp_path):
    target = tiny_target()
    tiny_drafter(target, "parallel").save(tmp_path / "d")
    with pytest.raises(SpecError, match=r"target\.load_drafter\(dir\)"):
        SpeculativeDecoder(target, load_drafter(tmp_path / "d"))
    SpeculativeDecoder(target, target.bind(load_drafter(tmp_path / "d")))  # bound by hand: fine


def test_a_pair_is_checked_once_on_the_generate_path(tmp_path, monkeypatch):
    target = tiny_target()
    tiny_drafter(target, "parallel").save(tmp_path / "d")
    calls = []
    real = binding.check_target_matches
    monkeypatch.setattr(
        "portable_spec.core.target.check_target_matches", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    decoder = SpeculativeDecoder(target, target.load_drafter(tmp_path / "d"))
    decoder.generate([[1, 2, 3]], GenerationConfig(max_new_tokens=6, num_draft_tokens=3))
    assert len(calls) == 1


def test_float16_load_fingerprints_the_stored_weights():
    """Issue 47 item 5: fp16 flushes the stored bf16 embedding's smallest values and rounds twice, so a
    fingerprint of the loaded copy named another target: `train --dtype float16` wrote drafters its own target
    refused, and `bench decode --dtype float16` refused the shipped ones."""
    from portable_spec.core import fixtures
    from portable_spec.core.binding import target_fingerprint
    from portable_spec.core.target import TargetModel

    stored = TargetModel.load(fixtures.target_dir()).fingerprint
    half = TargetModel.load(fixtures.target_dir(), dtype=torch.float16)
    model = half.model
    assert target_fingerprint(model.get_input_embeddings().weight, model.get_output_embeddings().weight) != stored
    assert half.fingerprint == stored
    assert half.binding()["fingerprint"] == stored  # what a float16 training run writes into its drafter
    assert half.load_drafter(fixtures.drafter_dir("parallel")).config.target.fingerprint == stored
