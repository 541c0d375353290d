"""portable-spec bench: `bench decode` (default; cli/bench_decode.py), `bench vllm` (cli/bench_vllm.py: the SmolLM2
drafters inside vLLM beside vLLM's own methods), `bench llamacpp` (adapters/llamacpp/bench.py: the drafters inside
the pinned llama.cpp beside its plain decoding and ngram modes) or `bench kernels` (portable_spec.kernels.bench).

Each is imported when run, so building the CLI imports neither vLLM, triton nor the kernels.
"""

from __future__ import annotations

import argparse

from portable_spec.core.spec import SpecError

BENCHES = ("decode", "vllm", "llamacpp", "kernels")
DEFAULT_BATCH_SIZES = {"decode": [1, 4], "vllm": [1, 8]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "what",
        nargs="?",
        default="decode",
        choices=BENCHES,
        help="decode: speculative decoding vs autoregressive (reference loop); vllm: the same drafters "
        "inside vLLM vs vLLM's ngram, dflash and no speculation; llamacpp: the exportable drafters inside "
        "llama.cpp vs its plain decoding (quantized and F32) and ngram modes; kernels: Triton kernels vs torch twins.",
    )
    parser.add_argument(
        "--n-max", type=int, nargs="+", default=[1, 3, 7, 15], help="llamacpp: --spec-draft-n-max values on Q4_1."
    )
    parser.add_argument("--threads", type=int, default=2, help="llamacpp: threads for llama.cpp and torch.")
    parser.add_argument("--kernel-repeats", type=int, default=5, help="kernels on CPU: timed runs per torch twin.")
    parser.add_argument(
        "--interpret",
        action="store_true",
        help="kernels on CPU: also check the kernels in Triton's interpreter (correctness, not time).",
    )
    from portable_spec.cli.bench_decode import add_decode_arguments

    add_decode_arguments(parser)
    from portable_spec.cli.bench_vllm import add_vllm_arguments

    add_vllm_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.kernel_repeats < 1:
        raise SpecError(f"--kernel-repeats={args.kernel_repeats}: must be at least 1")
    if args.what == "kernels":
        from portable_spec.kernels.bench import run_kernel_bench

        return run_kernel_bench(repeats=args.kernel_repeats, interpret=args.interpret)
    if args.what == "llamacpp":
        from portable_spec.adapters.llamacpp.bench import run_llamacpp_bench

        if args.threads < 1 or min(args.n_max) < 1 or max(args.n_max) > 15:
            raise SpecError(f"--threads={args.threads}, --n-max={args.n_max}: threads >= 1 and n_max in 1..15")
        return run_llamacpp_bench(args)
    if args.batch_sizes is None:
        args.batch_sizes = DEFAULT_BATCH_SIZES[args.what]
    if args.what == "vllm":
        from portable_spec.cli.bench_vllm import run_vllm_bench

        return run_vllm_bench(args)
    from portable_spec.cli.bench_decode import run_decode_bench

    return int(run_decode_bench(args) or 0)
