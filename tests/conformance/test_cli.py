"""`portable-spec conformance`: the table on stdout, the report written atomically, exit status from failures."""

from __future__ import annotations

from pathlib import Path

from portable_spec import cli
from portable_spec.conformance.golden import case_paths
from portable_spec.conformance.runner import load_expected_failures, resolve_backend, run_check, stale_cells
from portable_spec.conformance.suite import all_checks
from portable_spec.core.backends import backend_names

CHECKS = [check for check in all_checks() if check.oracle != "upstream"]  # .ci/upstream_oracle_tests.sh checks those


def test_cli_writes_the_report_and_passes_on_the_reference(tmp_path, capsys) -> None:
    report = tmp_path / "docs" / "conformance.md"
    code = cli.main(
        [
            "conformance",
            "--backends",
            "reference",
            "--checks",
            "golden/*",
            "verify/*",
            "target/*",
            "--output",
            str(report),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    text = report.read_text()
    assert "| check | reference |" in text and "| verify/distribution | pass |" in text
    selected = len(case_paths()) + 2  # every golden file, verify/no_global_rng, verify/distribution
    assert f"- reference: {selected} pass, 1 spec" in text  # target/forward: the reference is its oracle
    assert text in out  # the printed table is the written one
    assert [p.name for p in report.parent.iterdir()] == ["conformance.md"]  # no temp file left behind


def test_cli_rejects_unknown_backend_and_empty_selection(tmp_path, capsys) -> None:
    assert cli.main(["conformance", "--backends", "nope", "--output", "-"]) == 2
    assert "valid options: reference" in capsys.readouterr().err
    assert cli.main(["conformance", "--checks", "no/such/*", "--output", "-"]) == 2


def test_committed_report_is_current_for_the_backends_that_run_here(workspace, outcomes) -> None:
    """CI fails on a stale docs/conformance.md: every column that can run here (reference, onnx) must show what this
    run shows, status and reason per check, compared as `portable-spec conformance --check-report` compares them
    (the vLLM column is compared by .ci/vllm_engine_tests.sh, the upstream/* rows by .ci/upstream_oracle_tests.sh,
    which builds the upstream packages' venvs). Outcomes test_backends.py computed in this session
    are reused; the rest are run here."""
    report = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
    names = ["reference", "onnx"]
    expected = load_expected_failures(backend_names(), [check.id for check in all_checks()])
    resolved = {name: resolve_backend(name) for name in names}
    ran = [
        outcomes.get((name, check.id)) or run_check(resolved[name], check, workspace, expected)
        for name in names
        for check in CHECKS
    ]
    stale = stale_cells(
        ran, report, {name for name in names if resolved[name].unavailable is None and resolved[name].error is None}
    )
    assert not stale, "\n".join(stale)[:3000] + "\nregenerate it with `portable-spec conformance`"


def test_a_stale_report_is_caught(tmp_path, capsys) -> None:
    report = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
    tampered = tmp_path / "conformance.md"
    tampered.write_text(report.read_text().replace("| golden/top_k | pass |", "| golden/top_k | FAIL [1] |"))
    code = cli.main(
        [
            "conformance",
            "--backends",
            "reference",
            "--checks",
            "golden/top_k",
            "--output",
            "-",
            "--check-report",
            str(tampered),
        ]
    )
    out = capsys.readouterr().out
    assert code == 1 and "stale: reference x golden/top_k" in out
