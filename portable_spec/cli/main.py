"""`portable-spec` console script: each subcommand lives in portable_spec/cli/<name>.py.

The CLI is the top layer: it wires the core, adapters and conformance suite together; nothing imports it."""

from __future__ import annotations

import argparse
import importlib
import sys

from ..spec import SpecError

# subcommand -> module in portable_spec.cli exposing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "demo": "Speculative decoding on SmolLM2 with the shipped drafters vs plain greedy, HF generate, HF prompt lookup.",
    "fetch-target": "Convert a known target (smollm2) to a cached HF directory, verified by sha256 on reuse.",
    "bench": "Benchmarks printed as side-by-side ratios: `bench decode` (default) or `bench kernels`.",
    "train": "Train a drafter for any HF causal LM: regenerate replies, cache features, train (resumable).",
    "check": "Validate a drafter checkpoint, optionally against a target.",
    "generate": "Generate text with a target and (optionally) a drafter.",
    "export": "Export a drafter: `export onnx DRAFTER OUT` or `export trtllm DRAFTER OUT`.",
    "conformance": "Run the cross-backend conformance suite and write docs/conformance.md.",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="portable-spec", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"portable_spec.cli.{name.replace('-', '_')}")
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except SpecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
