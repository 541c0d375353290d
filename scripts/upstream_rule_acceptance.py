"""The acceptance each import choice gets on the fixture, for the drafters whose upstream code disagrees with itself
or with the engines that serve them (docs/upstream.md). Each drafter is built and saved by the upstream package's own
code with the trained fixture drafter's weights (the upstream oracle's worker), imported once per choice, and
decoded greedily by the reference on the four held-out fixture prompts with the whole block.

    PORTABLE_SPEC_UPSTREAM_VENVS=.venv-upstream python scripts/upstream_rule_acceptance.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from portable_spec.adapters.upstream.importer import import_drafter
from portable_spec.conformance.checks import _heldout_batch
from portable_spec.conformance.upstream_oracle.cases import CASES
from portable_spec.conformance.upstream_oracle.oracle import oracle_inputs, run_package
from portable_spec.core.backends import ReferenceBackend
from portable_spec.core.decode import GenerationConfig

CHOICES = {  # (package, case) -> import options, the trainer's first
    ("speculators", "sliding_b8"): [{}, {"window_rule": "per_slot"}],
    ("speculators", "sliding_b16"): [{}, {"window_rule": "per_slot"}],
    ("speculators", "mixed"): [{}, {"window_rule": "per_slot"}],
    ("dflash", "mixed"): [{}, {"block_attention": "bidirectional"}],
    ("dflash", "sliding"): [{}, {"block_attention": "bidirectional"}],
    ("specforge", "mixed"): [{}, {"block_attention": "bidirectional"}],
}


def main() -> None:
    target, _, prompts = _heldout_batch("parallel")
    reference = ReferenceBackend()
    inputs = oracle_inputs()
    print("| upstream drafter | import choice | tau | accepted drafts per position |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        answers = {}
        for (package, name), choices in CHOICES.items():
            if package not in answers:
                answers[package] = run_package(package, inputs, Path(root))
            case = next(c for c in CASES if c.package == package and c.name == name)
            config = GenerationConfig(max_new_tokens=32, num_draft_tokens=case.block_size - 1)
            for index, options in enumerate(choices):
                out = Path(root) / "imported" / f"{package}-{name}-{index}"
                drafter = import_drafter(answers[package][name].checkpoint, target, out, **options).out
                acceptance = reference.acceptance(target, drafter, prompts, config)
                label = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in options.items()) or "trainer (default)"
                print(
                    f"| {package} {name} (block {case.block_size}) | {label} | {acceptance.tau:.3f} | "
                    f"{acceptance.accepted_per_position} of {acceptance.rounds} rounds |"
                )


if __name__ == "__main__":
    main()
