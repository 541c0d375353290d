"""ruff (configured in pyproject.toml: lint E, F, W, import order; format at 120 columns) passes on the whole tree,
so the suite fails where the style drifts."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None, reason="ruff is in the dev extra: pip install -e '.[dev]'"
)
@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_passes(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
