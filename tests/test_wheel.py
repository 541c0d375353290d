"""The wheel installs one import package, `portable_spec` (no top-level `adapters`, `kernels` or test packages to
collide with AdapterHub's `adapters` or Hugging Face's `kernels`), and carries what the package reads at runtime."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a pip build
def test_wheel_has_one_top_level_package(tmp_path):
    # build from a clean copy: an in-tree build/ directory would leave stale files behind for later wheels
    source = tmp_path / "src"
    shutil.copytree(
        ROOT / "portable_spec", source / "portable_spec", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    # the installed setuptools when there is one (fast, offline), else pip's isolated build env (pyproject's pin)
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("portable_spec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"portable_spec"}
    assert not any("/tests/" in name or name.split("/")[-1].startswith("test_") for name in names)
    for needed in (
        "portable_spec/conformance/expected_failures.json",
        "portable_spec/conformance/golden/top_k.json",
        "portable_spec/assets/smollm2/MANIFEST.json",
        "portable_spec/cli/__main__.py",
    ):
        assert needed in names
    entry_points = next(zipfile.Path(wheel, n).read_text() for n in names if n.endswith("entry_points.txt"))
    assert "[portable_spec.backends]" in entry_points and "[portable_spec.kernels]" in entry_points
    assert "adapters." not in entry_points.replace("portable_spec.adapters.", "")
