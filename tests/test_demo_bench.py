"""The demo and the decode benchmark, end to end through the CLI on the fixture target (the SmolLM2 run is the same
code path with another setup): tables, the lossless verdict, HF baselines, and files written without wiping --out."""

import json
import re

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
        "| parallel (adaptive k) |",
        "| depth_causal (adaptive k) |",
        "| autoregressive (adaptive k) |",
        "depth_causal (cut < 0.3)",
        "HF generate",
        "HF prompt lookup (10)",
    ):
        assert row in out
    # the machine, the layout it measured and how each drafter's draft length was chosen
    assert "CPU threads" in out and "matmul layout measured on" in out
    assert re.search(r"depth_causal \(adaptive k\): draft length per round .*rounds plain\)", out)
    assert "every speculative output equals plain greedy output token for token: yes" in out
    assert "timings: plain decoding timed first and last on each of 2 prompts" in out or "timings UNRELIABLE" in out


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
    rows = json.loads((tmp_path / "benchmarks.json").read_text(), parse_constant=pytest.fail)  # NaN is no JSON
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


class FakeClock:
    """Every timed run takes 1 s, plus `drift` s per run already timed (a machine slowing down) and `extra[n]`
    on the n-th timed run: timings made by the test, not by the machine's load."""

    def __init__(self, extra: dict[int, float] | None = None, drift: float = 0.0) -> None:
        self.now, self.reads, self.extra, self.drift = 0.0, 0, extra or {}, drift

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 2 == 0:  # the read that ends timed run number reads // 2
            run = self.reads // 2
            self.now += 1.0 + self.drift * run + self.extra.get(run, 0.0)
        return self.now


def _fixture_comparison(clock):
    from portable_spec.bench.bench_setup import load_setup
    from portable_spec.bench.evaluate import compare, grid

    setup = load_setup("fixture", ("depth_causal",))
    return compare(setup.target, grid(setup.drafters, [3]), setup.prompts[:4], 4, progress=False, clock=clock)


def test_one_slow_timing_moves_the_row_total_but_not_the_median_of_ratios():
    """Per prompt: plain, depth_causal, plain (3 timed runs). Run 2 is depth_causal on prompt 1: made 10x slower."""
    steady = _fixture_comparison(FakeClock())
    assert [r.speedup for r in steady.rows] == [1.0, 1.0] and steady.reliable
    plain, depth_causal = _fixture_comparison(FakeClock(extra={2: 9.0})).rows
    assert depth_causal.speedup == 1.0  # the median over the 4 prompts ignores the one slow cell
    assert depth_causal.speedup_per_prompt[0] == pytest.approx(0.1) and depth_causal.speedup_spread[0] < 1.0
    total_ratio = depth_causal.tokens_per_second_total / plain.tokens_per_second_total
    assert total_ratio < 0.4  # what the old row-total speedup would have printed: 13 s against 4 s
    assert depth_causal.matches_plain_greedy


def test_a_machine_slowing_down_is_reported_as_unreliable_timings():
    comparison = _fixture_comparison(FakeClock(drift=0.1))  # each run 0.1 s slower than the one before
    assert not comparison.reliable and comparison.plain_drift > 0.1
    assert comparison.timing_note().startswith("timings UNRELIABLE") and "tau and passes/token stand" in (
        comparison.timing_note()
    )
    assert _fixture_comparison(FakeClock()).timing_note().startswith("timings: plain decoding timed first and last")
