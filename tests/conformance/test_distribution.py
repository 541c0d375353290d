"""The statistical check has teeth: the reference verifier passes it, classic rejection-sampling bugs fail it."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from portable_spec.conformance.distribution import ALPHA, chi_square, distribution_fits
from portable_spec.core.verify import verify
from tests.conformance.toy_backends import toy_verify


def test_reference_verifier_follows_the_target_distribution() -> None:
    fits = distribution_fits(verify)
    assert all(fit.ok for fit in fits), [str(fit) for fit in fits]
    assert max(fit.total_variation for fit in fits) < 0.02


def test_toy_verifier_without_bug_passes() -> None:
    """So a failure below is the bug's, not the restatement's."""
    assert all(fit.ok for fit in distribution_fits(partial(toy_verify, bug=None)))


@pytest.mark.parametrize("bug", ["accept_with_p", "resample_from_p", "unnormalised_residual", "off_by_one"])
def test_wrong_verifier_fails_by_a_wide_margin(bug: str) -> None:
    fits = distribution_fits(partial(toy_verify, bug=bug))
    worst = min(fit.p_value for fit in fits)
    assert not all(fit.ok for fit in fits)
    assert worst < ALPHA * 1e-6 or any(fit.impossible_tokens for fit in fits), [str(fit) for fit in fits]


def test_p_value_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    counts = torch.tensor([510, 260, 130, 100, 0])
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    fit = chi_square(counts, probs, "fixed")
    expected = stats.chisquare(counts[:4].double().numpy(), 1000 * probs[:4].double().numpy())
    assert fit.dof == 3
    assert fit.statistic == pytest.approx(expected.statistic)
    assert fit.p_value == pytest.approx(expected.pvalue, rel=1e-9)
