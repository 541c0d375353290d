"""Sampling edge cases that used to emit token 0 silently: tiny temperatures, +inf and all -inf logits, and out of
range parameters (refused when the parameters are built, before any model loads)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from portable_spec.core.sampling import MIN_TEMPERATURE, SamplingBatch, SamplingParams, target_probs


def probs(logits, **params):
    return target_probs(torch.tensor([[logits]]), SamplingBatch.from_params([SamplingParams(**params)]))[0, 0]


@pytest.mark.parametrize("temperature", [1e-45, 1e-40, 1e-20, MIN_TEMPERATURE / 2])
def test_tiny_temperature_is_greedy_not_token_zero(temperature):
    assert probs([0.5, 3.0, 1.0], temperature=temperature).tolist() == [0.0, 1.0, 0.0]


def test_above_min_temperature_still_samples():
    p = probs([0.0, 1e-6, 0.0], temperature=MIN_TEMPERATURE * 10)
    assert torch.isfinite(p).all() and 0 < p[1] < 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_positive_infinity_is_certainty(temperature):
    p = probs([1.0, float("inf"), 2.0, float("inf")], temperature=temperature)
    assert torch.isfinite(p).all()
    assert p.tolist() == ([0.0, 1.0, 0.0, 0.0] if temperature == 0 else [0.0, 0.5, 0.0, 0.5])


def test_all_negative_infinity_is_an_error_naming_the_slot():
    with pytest.raises(ValueError, match="all -inf .*request 0, chain slot 0"):
        probs([float("-inf")] * 3, temperature=1.0)


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("top_k", 2**31),
    ],
)
def test_out_of_range_parameters_are_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        SamplingParams(**{field: value})
