"""portable-spec conformance: every check x every registered backend; prints the table, writes docs/conformance.md.

The checks and the runner live in portable_spec/conformance/ (shipped with the package), the same code pytest runs.
Exit status 1 when any check FAILs or a listed expected failure passes; skips are reported, never passed.
"""

from __future__ import annotations

import argparse
import fnmatch
from pathlib import Path

import torch

from portable_spec.core.backends import backend_names
from portable_spec.core.outputs import write_file_atomically
from portable_spec.core.spec import SpecError

REPORT_HEADING = "# Conformance report"


def check_report_path(path: Path, force: bool) -> None:
    """--output is a file path whose folder can be made, and an existing file there is a report this command wrote
    (its heading says so), unless --force: checked before the suite runs."""
    for parent in [path, *path.parents]:
        if parent.is_dir() and parent == path:
            raise SpecError(f"--output {path}: is a directory; pass a file path such as {path / 'conformance.md'}")
        if parent.exists() and not parent.is_dir():
            if parent != path:
                raise SpecError(f"--output {path}: {parent} is a file, so no folder can be made there")
            first = path.read_text(errors="replace").split("\n", 1)[0]
            if first != REPORT_HEADING and not force:
                raise SpecError(
                    f"--output {path}: exists and is not a conformance report portable-spec wrote; pass "
                    "another path, or --force to replace it"
                )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", nargs="+", metavar="NAME", help="Backends to check (default: every registered).")
    parser.add_argument(
        "--checks",
        nargs="+",
        metavar="PATTERN",
        default=["*"],
        help="fnmatch patterns over check ids, e.g. 'golden/*' (default: all).",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("docs/conformance.md"),
        help="Markdown report to write (atomically); '-' writes nothing.",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the models are tiny).")
    parser.add_argument("--force", action="store_true", help="Replace an --output file this command did not write.")
    parser.add_argument(
        "--check-report",
        type=Path,
        metavar="PATH",
        help="Also compare every backend column that ran here with the committed report at PATH "
        "(status and reason per check); exit 1 if any differs, i.e. the report is stale.",
    )


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as transformers_logging

    from portable_spec.conformance.runner import (
        FAILING,
        SKIP,
        format_report,
        load_expected_failures,
        resolve_backend,
        run_suite,
        stale_cells,
    )
    from portable_spec.conformance.suite import all_checks
    from portable_spec.conformance.workspace import Workspace

    registered = backend_names()
    names = args.backends or registered
    unknown = [name for name in names if name not in registered]
    if unknown:
        raise SpecError(f"--backends {unknown} not registered; valid options: {', '.join(registered)}")
    if args.threads < 1:
        raise SpecError(f"--threads={args.threads}: must be at least 1")
    if str(args.output) != "-":
        check_report_path(args.output, args.force)
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
    versions = {r.name: r.backend.version() for r in resolved if r.backend is not None and r.unavailable is None}
    report = format_report(outcomes, selected, scope=", ".join(partial), versions=versions)
    print(report, end="")
    if str(args.output) != "-":
        write_file_atomically(args.output, lambda tmp: tmp.write_text(report))
        print(f"\nwrote {args.output}")
    failing = [o for o in outcomes if o.status in FAILING]
    skipped = [o for o in outcomes if o.status == SKIP]
    print(f"{len(failing)} failing, {len(skipped)} skipped (not verified) of {len(outcomes)} backend x check results")
    stale = []
    if args.check_report is not None:
        ran = {r.name for r in resolved if r.unavailable is None and r.error is None}
        stale = stale_cells(outcomes, args.check_report, ran)
        for line in stale:
            print(f"stale: {line}")
        print(
            f"{args.check_report}: "
            + (
                f"{len(stale)} cells differ from this run (backends {sorted(ran)}); "
                "regenerate it with `portable-spec conformance`"
                if stale
                else f"current for backends {sorted(ran)}"
            )
        )
    return 1 if failing or stale else 0
