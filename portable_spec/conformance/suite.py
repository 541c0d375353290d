"""The whole conformance suite in the report's order: the check families (checks.py), then the rows whose oracle is
the upstream packages' own code (upstream_oracle/checks.py, built on the families' helpers)."""

from __future__ import annotations

from portable_spec.conformance.checks import Check, family_checks
from portable_spec.conformance.upstream_oracle.checks import upstream_checks


def all_checks() -> list[Check]:
    return family_checks() + upstream_checks()
