"""`portable-spec conformance`: the table on stdout, the report written atomically, exit status from failures."""

from __future__ import annotations

from portable_spec import cli
from portable_spec.conformance.golden import case_paths


def test_cli_writes_the_report_and_passes_on_the_reference(tmp_path, capsys) -> None:
    report = tmp_path / "docs" / "conformance.md"
    code = cli.main(["conformance", "--backends", "reference", "--checks", "golden/*", "verify/*", "target/*",
                     "--output", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    text = report.read_text()
    assert "| check | reference |" in text and "| verify/distribution | pass |" in text
    selected = len(case_paths()) + 3  # every golden file, verify/no_global_rng, verify/distribution, target/forward
    assert f"- reference: {selected} pass" in text
    assert text in out  # the printed table is the written one
    assert [p.name for p in report.parent.iterdir()] == ["conformance.md"]  # no temp file left behind


def test_cli_rejects_unknown_backend_and_empty_selection(tmp_path, capsys) -> None:
    assert cli.main(["conformance", "--backends", "nope", "--output", "-"]) == 2
    assert "valid options: reference" in capsys.readouterr().err
    assert cli.main(["conformance", "--checks", "no/such/*", "--output", "-"]) == 2
