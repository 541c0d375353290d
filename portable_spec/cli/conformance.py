"""portable-spec conformance: every check x every registered backend; prints the table, writes docs/conformance.md.

The checks and the runner live in portable_spec/conformance/ (shipped with the package), the same code pytest runs.
Exit status 1 when any check FAILs or a listed expected failure passes; skips are reported, never passed.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import tempfile
from pathlib import Path

import torch

from ..backends import backend_names
from ..spec import SpecError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", nargs="+", metavar="NAME", help="Backends to check (default: every registered).")
    parser.add_argument("--checks", nargs="+", metavar="PATTERN", default=["*"],
                        help="fnmatch patterns over check ids, e.g. 'golden/*' (default: all).")
    parser.add_argument("--output", type=Path, default=Path("docs/conformance.md"),
                        help="Markdown report to write (atomically); '-' writes nothing.")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the models are tiny).")


def run(args: argparse.Namespace) -> int:
    from portable_spec.conformance.checks import all_checks
    from portable_spec.conformance.runner import (FAILING, SKIP, format_report, load_expected_failures,
                                          resolve_backend, run_suite)
    from portable_spec.conformance.workspace import Workspace
    from transformers.utils import logging as transformers_logging

    registered = backend_names()
    names = args.backends or registered
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise SpecError(f"--backends {unknown} not registered; valid options: {', '.join(registered)}")
    checks = all_checks()
    selected = [c for c in checks if any(fnmatch.fnmatchcase(c.id, pattern) for pattern in args.checks)]
    if not selected:
        raise SpecError(f"--checks {args.checks} match no check; ids look like 'golden/top_k', 'e2e/greedy_tiny/*'")
    expected = load_expected_failures(registered, [c.id for c in checks])
    torch.set_num_threads(args.threads)
    transformers_logging.disable_progress_bar()  # model loads would bury the table

    resolved = [resolve_backend(name) for name in names]
    with Workspace.temporary() as workspace:
        outcomes = run_suite(resolved, selected, workspace, expected)
    partial = [f"--backends {' '.join(names)}"] if args.backends else []
    partial += [f"--checks {' '.join(args.checks)}"] if args.checks != ["*"] else []
    report = format_report(outcomes, selected, scope=", ".join(partial))
    print(report, end="")
    if str(args.output) != "-":
        _write_atomically(args.output, report)
        print(f"\nwrote {args.output}")
    failing = [o for o in outcomes if o.status in FAILING]
    skipped = [o for o in outcomes if o.status == SKIP]
    print(f"{len(failing)} failing, {len(skipped)} skipped (not verified) of {len(outcomes)} backend x check results")
    return 1 if failing else 0


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
