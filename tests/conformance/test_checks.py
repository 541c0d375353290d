"""The held-out check itself, independent of whether the trained fixtures exist yet on this machine."""

from __future__ import annotations

import json

import pytest

from portable_spec.conformance.runner import PASS, SKIP, ExpectedFailures, resolve_backend, run_check
from portable_spec.conformance.suite import all_checks
from portable_spec.core import fixtures

CHECKS = {check.id: check for check in all_checks()}
NONE_EXPECTED = ExpectedFailures(format_version=1, entries=[])


@pytest.fixture
def assets(tmp_path, monkeypatch):
    root = tmp_path / "portable_spec" / "assets"
    root.mkdir(parents=True)
    monkeypatch.setattr(fixtures, "ASSETS", root)
    fixtures.heldout_prompts.cache_clear()
    yield root
    fixtures.heldout_prompts.cache_clear()


def test_heldout_check_skips_naming_what_is_missing(assets, workspace) -> None:
    outcome = run_check(
        resolve_backend("reference"), CHECKS["e2e/greedy_heldout/depth_causal"], workspace, NONE_EXPECTED
    )
    assert outcome.status == SKIP
    assert "portable_spec/assets/drafters/depth_causal" in outcome.detail and "make_fixtures.py" in outcome.detail


def test_heldout_check_runs_on_the_fixture_layout(assets, workspace) -> None:
    """Stand-in fixtures (the random tiny models) in the shipped layout: the check runs and compares."""
    (assets / "drafters").mkdir()
    (assets / "target").symlink_to(workspace.tiny_target(), target_is_directory=True)
    (assets / "drafters" / "depth_causal").symlink_to(workspace.tiny_drafter("depth_causal"), target_is_directory=True)
    prompts = [{"ids": [(7 * i + j) % 200 for j in range(48)], "text": ""} for i in range(4)]
    (assets / "heldout_prompts.json").write_text(json.dumps(prompts))
    outcome = run_check(
        resolve_backend("reference"), CHECKS["e2e/greedy_heldout/depth_causal"], workspace, NONE_EXPECTED
    )
    assert outcome.status == PASS, outcome.detail
