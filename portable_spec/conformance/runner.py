"""Runs checks over backends and reports outcomes: the one runner under pytest and `portable-spec conformance`.

Statuses: pass; FAIL; skip (the backend cannot run here, or lacks an optional method: never counted as a
pass); xfail (a known gap listed in expected_failures.json); XPASS (listed as a gap but passed: a failure
until the entry is removed, so the list cannot go stale); inherits (the backend runs the reference's own code
for the component the check exercises: comparing it would compare the reference with itself); spec (the
reference column of a check whose only oracle is the reference).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from portable_spec.conformance.checks import Check, CheckContext, CheckFailed
from portable_spec.conformance.golden import FORMAT_VERSION as GOLDEN_FORMAT_VERSION
from portable_spec.conformance.workspace import CheckSkipped, Workspace
from portable_spec.core.backends import Backend, get_backend, inherited_components, is_reference
from portable_spec.core.spec import SpecError

EXPECTED_FAILURES = Path(__file__).parent / "expected_failures.json"
PASS, FAIL, SKIP, XFAIL, XPASS = "pass", "FAIL", "skip", "xfail", "XPASS"
INHERITS, SPEC = "inherits reference", "spec"
STATUSES = (PASS, FAIL, SKIP, XFAIL, XPASS, INHERITS, SPEC)
FAILING = (FAIL, XPASS)


class ExpectedFailure(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = Field(description="A registered backend name (portable_spec.core.backends.BACKENDS).")
    check: str = Field(description="fnmatch pattern over check ids, e.g. 'e2e/sampled_tiny/*'.")
    reason: str = Field(min_length=10, description="Why it fails and what would fix it (or the issue tracking it).")


class ExpectedFailures(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = Field(description="1")
    about: str = ""
    entries: list[ExpectedFailure]

    def reason_for(self, backend: str, check_id: str) -> str | None:
        return next(
            (e.reason for e in self.entries if e.backend == backend and fnmatch.fnmatchcase(check_id, e.check)), None
        )


def load_expected_failures(
    backends: Iterable[str], check_ids: Iterable[str], path: Path = EXPECTED_FAILURES
) -> ExpectedFailures:
    """Parse and validate the checked-in list; an entry naming no registered backend or no check is a SpecError."""
    if not Path(path).exists():
        raise SpecError(
            f"{path}: not found; it ships beside the suite (pyproject package-data for portable_spec.conformance "
            "must list expected_failures.json)"
        )
    try:
        expected = ExpectedFailures.model_validate(json.loads(Path(path).read_text()))
    except (ValidationError, json.JSONDecodeError) as error:
        raise SpecError(f"{path}: invalid expected-failures list: {error}") from None
    backends, check_ids = set(backends), list(check_ids)
    for index, entry in enumerate(expected.entries):
        if entry.backend not in backends:
            raise SpecError(
                f"{path}: entries[{index}].backend={entry.backend!r} is not registered; "
                f"valid options: {', '.join(sorted(backends))}"
            )
        if not fnmatch.filter(check_ids, entry.check):
            raise SpecError(
                f"{path}: entries[{index}].check={entry.check!r} matches no check; remove the entry "
                "or fix the pattern (ids are listed in docs/conformance.md)"
            )
    return expected


@dataclass(frozen=True)
class Outcome:
    backend: str
    check: str
    status: str
    detail: str = ""


@dataclass(frozen=True)
class ResolvedBackend:
    """A registry entry made ready to run: the instance, or why every check fails or is skipped."""

    name: str
    backend: Backend | None
    error: str | None = None  # construction failed: every check FAILs (adapters must import engines lazily)
    unavailable: str | None = None  # cannot run here: every check is skipped with this reason


def resolve_backend(name: str, backend: Backend | None = None) -> ResolvedBackend:
    try:
        backend = backend if backend is not None else get_backend(name)
        reason = backend.unavailable_reason()
    except Exception as error:  # noqa: BLE001 - reported as this backend's failure
        return ResolvedBackend(
            name, None, error=f"backend {name!r} could not be constructed or queried: {type(error).__name__}: {error}"
        )
    return ResolvedBackend(name, backend, unavailable=reason)


def run_check(resolved: ResolvedBackend, check: Check, workspace: Workspace, expected: ExpectedFailures) -> Outcome:
    name = resolved.name
    if resolved.error is not None:
        return Outcome(name, check.id, FAIL, resolved.error)
    if resolved.unavailable is not None:
        return Outcome(name, check.id, SKIP, f"backend unavailable here: {resolved.unavailable}")
    if is_reference(resolved.backend):
        if check.oracle == "reference":
            return Outcome(name, check.id, SPEC, "the reference is what this check compares every backend against")
    elif check.exercises in (inherited := inherited_components(resolved.backend)):
        return Outcome(
            name,
            check.id,
            INHERITS,
            f"{type(resolved.backend).__name__} runs the reference's "
            f"{inherited[check.exercises]} for {check.exercises}: no independent code to check",
        )
    try:
        check.run(CheckContext(name, resolved.backend, workspace))
        status, detail = PASS, ""
    except CheckSkipped as skip:
        return Outcome(name, check.id, SKIP, str(skip))
    except NotImplementedError as error:
        reason = expected.reason_for(name, check.id)
        if reason is not None:  # a listed gap: the backend cannot offer this, and says why
            return Outcome(name, check.id, XFAIL, f"{reason} (the backend: {error})")
        return Outcome(name, check.id, SKIP, f"not implemented by the backend (optional method): {error}")
    except CheckFailed as failure:
        status, detail = FAIL, str(failure)
    except Exception as error:  # noqa: BLE001 - a crash is a failure of this backend on this check
        status, detail = FAIL, f"raised {type(error).__name__}: {error}"
    reason = expected.reason_for(name, check.id)
    if reason is not None:
        if status == PASS:
            return Outcome(name, check.id, XPASS, "listed in expected_failures.json but passed: remove the entry")
        return Outcome(name, check.id, XFAIL, f"{reason} (was: {detail})")
    return Outcome(name, check.id, status, detail)


def run_suite(
    backends: list[ResolvedBackend], checks: list[Check], workspace: Workspace, expected: ExpectedFailures
) -> list[Outcome]:
    return [run_check(resolved, check, workspace, expected) for resolved in backends for check in checks]


def parse_report(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(backend, check) -> (status, detail) from a report format_report wrote (its table and numbered notes)."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| check | ") and "passing asserts" not in line)
    backends = [cell.strip() for cell in lines[header].strip("|").split("|")[1:]]
    notes = {}
    for line in lines:
        head, _, detail = line.partition(": ")
        number, dot, rest = head.partition(". ")
        if dot and number.isdigit() and rest.endswith(")") and " (" in rest:
            notes[number] = detail
    cells = {}
    for line in lines[header + 2 :]:
        if not line.startswith("| "):
            break
        parts = [cell.strip() for cell in line.strip("|").split("|")]
        for backend, cell in zip(backends, parts[1:]):
            if cell == "-":
                continue
            status, _, note = cell.partition(" [")
            cells[backend, parts[0]] = (status, notes.get(note.rstrip("]"), "") if note else "")
    return cells


def _stable(detail: str) -> str:
    """A reason without what the run happened to print after it (an xfail's "(was: ...)" may hold engine garbage)."""
    return detail.replace("\n", " ").split(" (was: ")[0]


def stale_cells(outcomes, report_path: Path, backends: set[str]) -> list[str]:
    """Cells of the committed report that disagree with `outcomes` for the given backends (status and reason)."""
    if not Path(report_path).is_file():
        raise SpecError(f"--check-report {report_path}: not a file; generate it with `portable-spec conformance`")
    committed = parse_report(Path(report_path).read_text())
    differ = []
    for outcome in outcomes:
        if outcome.backend not in backends:
            continue
        now = (outcome.status, "" if outcome.status in (PASS, SPEC) else _stable(outcome.detail))
        then = committed.get((outcome.backend, outcome.check))
        if then is not None:
            then = (then[0], _stable(then[1]))
        if then != now:
            differ.append(f"{outcome.backend} x {outcome.check}: committed {then}, this run {now}")
    return differ


def format_report(
    outcomes: list[Outcome], checks: list[Check], scope: str = "", versions: dict[str, str] | None = None
) -> str:
    """Markdown: the check x backend matrix, per-backend counts, numbered notes for every non-pass, descriptions."""
    backends = list(dict.fromkeys(o.backend for o in outcomes))
    cell, notes = {}, {}  # notes: (status, detail) -> [number, backends]
    for o in outcomes:
        if o.status in (PASS, SPEC):
            cell[o.backend, o.check] = o.status
        else:
            note = notes.setdefault((o.status, o.detail), [len(notes) + 1, []])
            note[1] += [o.backend] if o.backend not in note[1] else []
            cell[o.backend, o.check] = f"{o.status} [{note[0]}]"
    lines = [
        "# Conformance report",
        "",
        "Written by `portable-spec conformance`; do not edit by hand. Each check is defined once in",
        "`portable_spec/conformance/checks.py` (the `upstream/*` rows in `upstream_oracle/checks.py`) and run by both",
        "pytest and that command. A skip is not a pass.",
        f"Statuses: {PASS}; {FAIL}; {SKIP} (with its reason); {XFAIL} (known gap in "
        f"`portable_spec/conformance/expected_failures.json`); {XPASS} (listed as a gap but passed: remove the entry); "
        f"{INHERITS} (the backend runs the reference's own code for what the check exercises, so it was not compared); "
        f"{SPEC} (the reference column where the reference itself is the oracle). No check compares an object with "
        "itself: such a comparison fails.",
        "",
        f"torch {torch.__version__}, transformers {transformers.__version__}, golden format {GOLDEN_FORMAT_VERSION}."
        + "".join(f" {name}: {version}." for name, version in (versions or {}).items() if version)
        + (f" Partial run: {scope}." if scope else ""),
        "",
        "| check | " + " | ".join(backends) + " |",
        "| --- |" + " --- |" * len(backends),
    ]
    for check in checks:
        if any((b, check.id) in cell for b in backends):
            lines.append(f"| {check.id} | " + " | ".join(cell.get((b, check.id), "-") for b in backends) + " |")
    lines += ["", "## Summary", ""]
    for backend in backends:
        statuses = [o.status for o in outcomes if o.backend == backend]
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in STATUSES if s in statuses)
        lines.append(f"- {backend}: {counts}")
    if notes:
        lines += ["", "## Notes", ""]
        for (status, detail), (number, names) in notes.items():
            lines.append(f"{number}. {status} ({', '.join(names)}): {detail}".replace("\n", " "))
    lines += ["", "## Checks", "", "| check | passing asserts |", "| --- | --- |"]
    lines += [f"| {c.id} | {c.description.replace('|', '&#124;')} |" for c in checks]
    return "\n".join(lines) + "\n"
