"""The work dir's layout is named in one place (portable_spec/training/work_dir.py, issue 46): no other module of the
package or the scripts spells one of its paths."""

from __future__ import annotations

import re
from pathlib import Path

from portable_spec.training.work_dir import WorkDir

ROOT = Path(__file__).resolve().parents[1]
# how the layout was spelled before WorkDir: f"state-{...}", "best-...", "...-loss.jsonl", "...-heldout.jsonl",
# the prompt files, and a work dir's "data" / "heldout" folders
WORK = r"(work|work_dir|self\.work|args\.work_dir)\s*/\s*f?"
LITERALS = re.compile(
    r"""["']state-|["']best-(?!drafter)|-loss\.jsonl["']|-heldout\.jsonl["']|["']prompt_settings\.json["']|"""
    rf"""{WORK}["'](train_prompts\.json|heldout_prompts\.json|data|heldout)["']|\.train-\{{"""
)  # (the package's own assets/heldout_prompts.json is not a work dir's file; "best-drafter" is an output kind)


def test_no_work_dir_path_literal_outside_work_dir():
    own = ROOT / "portable_spec/training/work_dir.py"
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted([*(ROOT / "portable_spec").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])
        if path != own
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if LITERALS.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, "\n".join(found)


def test_the_layout():
    work = WorkDir("runs/x")
    assert work.state("depth_causal") == Path("runs/x/state-depth_causal")
    assert work.loss_log("parallel").name == "parallel-loss.jsonl"
    assert work.training_lock("a") != work.training_lock("b") != work.data_lock


def test_one_comparison_names_every_changed_setting():
    from portable_spec.training.work_dir import changed_settings

    saved, asked = {"lr": 0.002, "steps": 10, "seed": 0}, {"lr": 0.0001, "steps": 20, "seed": 0}
    assert changed_settings(saved, asked) == ["lr: saved 0.002, asked 0.0001", "steps: saved 10, asked 20"]
    assert changed_settings(saved, asked, ignore=("steps",)) == ["lr: saved 0.002, asked 0.0001"]
    assert changed_settings({"prompt_turns": "first"}, {"prompt_turns": "all"}, words=("prepared", "asked"),
                            flags=True) == ["prompt-turns: prepared 'first', asked 'all'"]  # fmt: skip


def test_every_settings_check_uses_the_one_comparison():
    """Issue 46: "refuse a work dir made with other settings" was written six ways."""
    users = {
        "portable_spec/training/state.py": 3,  # resume: drafter and training config; warm start
        "portable_spec/training/prompts.py": 1,  # prepared prompts
        "portable_spec/training/replies.py": 1,  # replies
        "portable_spec/training/features.py": 1,  # cached features
        "portable_spec/cli/train.py": 1,  # --init-from, before any model loads
    }
    for path, calls in users.items():
        assert (ROOT / path).read_text().count("changed_settings(") == calls, path
