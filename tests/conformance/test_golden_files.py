"""The golden files themselves: versioned, complete, and still regenerable from their noise keys."""

from __future__ import annotations

import json

import pytest
import torch

from portable_spec.conformance.golden import FORMAT_VERSION, TAGS, GoldenError, case_paths, load_case, to_tensors
from portable_spec.core.sampling import target_probs

PATHS = case_paths()


def test_golden_files_exist_and_cover_every_tag() -> None:
    covered = {tag for path in PATHS for tag in load_case(path).tags}
    assert len(PATHS) >= 8
    assert covered == set(TAGS), f"no golden file covers {sorted(set(TAGS) - covered)}"


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_golden_file_is_consistent(path) -> None:
    case = load_case(path)
    assert case.format_version == FORMAT_VERSION
    golden = to_tensors(case)  # raises if the noise key no longer regenerates the checksummed uniforms
    batch, chain, vocab = golden.target_logits.shape
    assert golden.output_tokens.shape == (batch, chain)
    assert golden.noise.sample_uniform.shape == (batch, chain, vocab)
    # the shared sampling transform still yields the stored p (informative field, float tolerance)
    torch.testing.assert_close(
        target_probs(golden.target_logits, golden.sampling), golden.target_probs, atol=1e-6, rtol=0
    )


def test_loader_refuses_other_format_version(tmp_path) -> None:
    raw = json.loads(PATHS[0].read_text())
    raw["format_version"] = FORMAT_VERSION + 1
    path = tmp_path / PATHS[0].name
    path.write_text(json.dumps(raw))
    with pytest.raises(GoldenError, match="format_version"):
        load_case(path)


def test_changed_noise_stream_is_reported_not_silently_used(tmp_path) -> None:
    raw = json.loads(PATHS[0].read_text())
    raw["inputs"]["noise"]["seed"] += 1  # the key no longer produces the checksummed uniforms
    path = tmp_path / PATHS[0].name
    path.write_text(json.dumps(raw))
    with pytest.raises(GoldenError, match="noise.py"):
        to_tensors(load_case(path))
