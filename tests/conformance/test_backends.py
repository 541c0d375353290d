"""The suite generated over every registered backend x every check (the ONNX backend test suite's shape).

A backend joins by registering in the `portable_spec.backends` entry-point group; nothing here names a backend.
"""

from __future__ import annotations

from functools import cache

import pytest

from portable_spec.conformance.runner import (
    FAIL,
    INHERITS,
    SKIP,
    SPEC,
    XFAIL,
    XPASS,
    ResolvedBackend,
    load_expected_failures,
    resolve_backend,
    run_check,
)
from portable_spec.conformance.suite import all_checks
from portable_spec.core.backends import backend_class, backend_names

CHECKS = all_checks()
EXPECTED = load_expected_failures(backend_names(), [check.id for check in CHECKS])


@cache
def _resolved(name: str) -> ResolvedBackend:
    return resolve_backend(name)


@pytest.mark.parametrize(
    "backend_name, check",
    [
        # the upstream/* rows run the upstream packages' own code in their venvs: the `upstream` CI stage's; a
        # backend with a marker (an engine its own CI stage builds) is that stage's
        pytest.param(
            name,
            check,
            id=f"{name}:{check.id}",
            marks=[pytest.mark.upstream] * (check.oracle == "upstream")
            + [getattr(pytest.mark, marker) for marker in [backend_class(name).pytest_marker] if marker],
        )
        for name in backend_names()
        for check in CHECKS
    ],
)
def test_conformance(backend_name, check, workspace, outcomes) -> None:
    outcome = outcomes[backend_name, check.id] = run_check(_resolved(backend_name), check, workspace, EXPECTED)
    if outcome.status in (SKIP, INHERITS, SPEC):  # none of them is a pass
        pytest.skip(f"{outcome.status}: {outcome.detail}")
    if outcome.status == XFAIL:
        pytest.xfail(outcome.detail)
    if outcome.status in (FAIL, XPASS):
        pytest.fail(f"{outcome.status}: {outcome.detail}", pytrace=False)
