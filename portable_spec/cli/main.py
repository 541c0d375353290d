"""`portable-spec` console script: each subcommand lives in portable_spec/cli/<name>.py (`import`, a Python
keyword, in import_checkpoint.py).

The CLI is the top layer: it wires the core, adapters and conformance suite together; nothing imports it."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from pydantic import ValidationError

from portable_spec.core.errors import first_line, validation_line
from portable_spec.core.spec import SpecError
from portable_spec.training.parallel import MainFailed, RankStopped, error_prefix

# subcommand -> module in portable_spec.cli exposing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "demo": "Speculative decoding on SmolLM2 with the shipped drafters vs plain greedy, HF generate, HF prompt lookup.",
    "fetch-target": "Convert a known target (smollm2) to a cached HF directory, verified by sha256 on reuse.",
    "bench": "Benchmarks printed as side-by-side ratios: `bench decode` (default) or `bench kernels`.",
    "train": "Train a drafter for any HF causal LM: regenerate replies, cache features, train (resumable).",
    "check": "Validate a drafter checkpoint, optionally against a target.",
    "generate": "Generate text with a target and (optionally) a drafter.",
    "import": "Import an upstream DFlash drafter (z-lab/dflash, SpecForge, speculators) bound to its target.",
    "export": "Export a drafter: `export onnx|trtllm|speculators DRAFTER OUT`.",
    "conformance": "Run the cross-backend conformance suite and write docs/conformance.md.",
}
MODULES = {"import": "import_checkpoint"}  # commands whose module is not named after them


def _os_fix(error: OSError) -> str:
    fixes = {
        errno.ENOSPC: "; free disk space and rerun (outputs are written whole or not at all)",
        errno.EACCES: "; pass a path you may write to",
        errno.EROFS: "; pass a writable path",
        errno.ELOOP: "; a symlink loop: pass the real path",
    }
    return fixes.get(error.errno, "")


def describe(error: BaseException) -> tuple[str, int]:
    """(one-line message, exit status) for an error a user can meet; 2 = bad input, 1 = anything else."""
    if isinstance(error, SpecError):
        return str(error), 2
    if isinstance(error, RankStopped):  # another rank failed: its line, or torchrun's report, says how
        return str(error), 1
    if isinstance(error, ValidationError):
        return validation_line(error), 2
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.filename}: {error.strerror or error}{_os_fix(error)}", 2
    if isinstance(error, OSError):
        return f"{error.strerror or error}{_os_fix(error)}", 2
    return f"unexpected {type(error).__name__}: {first_line(error)} (rerun with --debug for the traceback)", 1


INTERRUPTED = "error: interrupted; outputs are written whole or not at all, so nothing half-written was left"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portable-spec", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"portable_spec.cli.{MODULES.get(name, name.replace('-', '_'))}")
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:  # Ctrl-C at any point, imports included, ends with one line
        args = build_parser().parse_args(argv)
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        if os.environ.get("RANK", "0") == "0":  # Ctrl-C reaches every rank of a torchrun job: one line, rank 0's
            print(INTERRUPTED, file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the one place errors become `error:` lines
        if debug:
            raise
        message, status = describe(error)
        prefix = _rank_prefix(error)
        if prefix is not None:
            print(f"error: {prefix}{message}", file=sys.stderr)
        return status


def _rank_prefix(error: BaseException) -> str | None:
    """ "" for one process; under torchrun, which rank speaks (training/parallel.error_prefix), None for silence."""
    return None if isinstance(error, MainFailed) else error_prefix()


if __name__ == "__main__":
    sys.exit(main())
