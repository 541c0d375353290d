"""portable-spec bench: `bench decode` (default; portable_spec.bench_decode) or `bench kernels` (kernels.bench).

Both are imported when run, so building the CLI imports neither triton nor the kernels.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

BENCHES = ("decode", "kernels")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", nargs="?", default="decode", choices=BENCHES,
                        help="decode: speculative decoding vs autoregressive; kernels: Triton kernels vs torch twins.")
    parser.add_argument("--kernel-repeats", type=int, default=5, help="kernels on CPU: timed runs per torch twin.")
    parser.add_argument("--interpret", action="store_true",
                        help="kernels on CPU: also check the kernels in Triton's interpreter (correctness, not time).")
    decode = _decode_module()
    if decode is not None and hasattr(decode, "add_decode_arguments"):
        decode.add_decode_arguments(parser)  # the decode bench's own options


def run(args: argparse.Namespace) -> int:
    if args.what == "kernels":
        from kernels.bench import run_kernel_bench

        return run_kernel_bench(repeats=args.kernel_repeats, interpret=args.interpret)
    decode = _decode_module()
    if decode is None:
        print("bench decode: portable_spec.bench_decode is not in this checkout yet (it provides "
              "run_decode_bench(args)); `portable-spec bench kernels` works now")
        return 2
    return int(decode.run_decode_bench(args) or 0)


def _decode_module() -> ModuleType | None:
    try:
        return importlib.import_module("portable_spec.bench_decode")
    except ModuleNotFoundError as error:
        if error.name != "portable_spec.bench_decode":
            raise
        return None
