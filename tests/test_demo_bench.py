"""The demo and the decode benchmark, end to end through the CLI on the fixture target (the SmolLM2 run is the same
code path with another setup): tables, the lossless verdict, HF baselines, and files written without wiping --out."""

import json

import pytest

from portable_spec.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_demo_prints_every_row_and_the_lossless_verdict(capsys):
    assert (
        main(["demo", "--target", "fixture", "--prompts", "2", "--max-new-tokens", "8", "--draft-confidence", "0.3"])
        == 0
    )
    out = capsys.readouterr().out
    for row in (
        "plain greedy",
        "| parallel |",
        "| depth_causal |",
        "| autoregressive |",
        "depth_causal (cut < 0.3)",
        "HF generate",
        "HF prompt lookup (10)",
    ):
        assert row in out
    assert "every speculative output equals plain greedy output token for token: yes" in out


@pytest.mark.parametrize(
    "option,value",
    [("--prompts", "0"), ("--max-new-tokens", "0"), ("--batch-size", "0"), ("--draft-confidence", "1.5")],
)
def test_demo_refuses_bad_options_in_one_line(capsys, option, value):
    assert main(["demo", "--target", "fixture", option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and option in err and "Traceback" not in err


def test_bench_writes_its_files_and_leaves_the_rest_of_out_alone(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep")
    assert (
        main(
            [
                "bench",
                "decode",
                "--target",
                "fixture",
                "--prompts",
                "2",
                "--max-new-tokens",
                "8",
                "--block-sizes",
                "4",
                "--batch-sizes",
                "1",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "benchmarks.json").read_text())
    assert {r["batch_size"] for r in rows} == {1, 2} and (tmp_path / "mine.txt").read_text() == "keep"
    cut = [r for r in rows if "cut" in r["drafter"]]
    assert cut and all(r["drafts_verified_per_round"] <= 3 for r in cut)
    assert all(len(r["acceptance_by_position"]) == 3 for r in rows if r["drafter"] == "depth_causal")
    assert (tmp_path / "benchmarks.png").stat().st_size > 1000 and "| depth_causal |" in (
        tmp_path / "benchmarks.md"
    ).read_text()


def test_one_new_token_is_prefill_only(capsys):
    """--max-new-tokens 1: the prompt pass emits the token, no round runs; tau is n/a, not a ZeroDivisionError."""
    assert (
        main(
            [
                "demo",
                "--target",
                "fixture",
                "--prompts",
                "1",
                "--max-new-tokens",
                "1",
                "--no-hf",
                "--kinds",
                "depth_causal",
            ]
        )
        == 0
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| depth_causal")]
    assert len(rows) == 1 and "| n/a |" in rows[0]
