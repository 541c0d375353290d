"""scripts/ship_smollm2_drafters.py: a run from scratch is shipped; a run warm-started from the shipped drafter
replaces it only when its best held-out tau beats the shipped drafter's own on the same held-out sequences, and is
recorded in the manifest either way, once."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from portable_spec.cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
ARGS = [
    "train", "--target", "fixture", "--kind", "depth_causal", "--num-prompts", "16", "--max-new-tokens", "12",
    "--block-size", "4", "--num-hidden-layers", "1", "--seq-len", "32", "--batch-size", "2", "--anchors-per-seq", "2",
    "--heldout-eval-prompts", "3", "--eval-blocks", "4", "--reply-batch-size", "8", "--warmup-steps", "0",
    "--generator", "hf",
]  # fmt: skip


def _ship_script():
    spec = importlib.util.spec_from_file_location("ship_script", ROOT / "scripts" / "ship_smollm2_drafters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(work: Path, data: Path, *extra: str) -> None:
    assert main([*ARGS, "--data", str(data), "--work-dir", str(work), "--out", str(work / "drafters/depth_causal"),
                 *extra]) == 0  # fmt: skip


def test_a_warm_start_replaces_the_shipped_drafter_only_when_it_beats_it_held_out(tmp_path):
    ship = _ship_script()
    data = tmp_path / "share.json"
    data.write_text(
        json.dumps(
            [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"note {i} on files"}]} for i in range(60)]
        )
    )
    assets, shipped = tmp_path / "assets", tmp_path / "assets/drafters/depth_causal"
    _train(tmp_path / "scratch", data, "--steps", "3")
    ship.main(["--work-dir", str(tmp_path / "scratch"), "--kinds", "depth_causal", "--assets", str(assets)])
    manifest = json.loads((assets / "MANIFEST.json").read_text())
    assert manifest["drafters"]["depth_causal"]["steps"] == 3 and manifest["train_prompts"] > 0
    before = (shipped / "model.safetensors").read_bytes()
    # the run wrote its settings; --config reads them back as the same run (it resumes), here one step longer
    scratch = tmp_path / "scratch"
    run_file = scratch / "depth_causal-run.json"
    assert json.loads(run_file.read_text())["train"]["steps"] == 3
    out = ["--work-dir", str(scratch), "--out", str(scratch / "drafters/depth_causal")]
    assert main(["train", "--config", str(run_file), "--steps", "4", *out]) == 0
    assert json.loads((scratch / "state-depth_causal/trainer_state.json").read_text())["step"] == 4

    warm = tmp_path / "warm"  # lr 1e-12 learns nothing: its best held-out tau is the shipped drafter's own
    _train(warm, data, "--steps", "2", "--lr", "1e-12", "--init-from", str(shipped))
    ship.main(["--work-dir", str(warm), "--kinds", "depth_causal", "--assets", str(assets)])
    ship.main(["--work-dir", str(warm), "--kinds", "depth_causal", "--assets", str(assets)])  # recorded once
    record = json.loads((assets / "MANIFEST.json").read_text())["drafters"]["depth_causal"]
    [run] = record["warm_starts"]
    assert not run["replaced_shipped"] and run["heldout_tau"] == run["heldout_tau_at_start"]
    assert record["steps"] == 3 and (shipped / "model.safetensors").read_bytes() == before

    # the same run, had it gained held out: its (changed) drafter and figures replace the shipped ones
    out = warm / "drafters/depth_causal/model.safetensors"
    trained = {k: v + 0.5 if v.is_floating_point() else v for k, v in load_file(str(out)).items()}
    save_file(trained, str(out))
    log = warm / "depth_causal-heldout.jsonl"
    last = json.loads(log.read_text().splitlines()[-1])
    gained = {**last, "step": 2, "tau": {"4": run["heldout_tau"] + 0.25}}
    log.write_text(log.read_text() + json.dumps(gained) + "\n")
    ship.main(["--work-dir", str(warm), "--kinds", "depth_causal", "--assets", str(assets)])
    record = json.loads((assets / "MANIFEST.json").read_text())["drafters"]["depth_causal"]
    assert [r["replaced_shipped"] for r in record["warm_starts"]] == [False, True]
    assert record["steps"] == 3 + 2 and record["heldout_tau"] == pytest.approx(run["heldout_tau"] + 0.25)
    now = load_file(str(shipped / "model.safetensors"))
    assert all(torch.equal(now[k], v.to(now[k].dtype)) for k, v in trained.items())
    assert all(t.dtype == torch.bfloat16 for t in now.values() if t.is_floating_point())  # shipped as bf16

    with pytest.raises(SystemExit, match="warm-started from .*, not the shipped"):
        ship.main(["--work-dir", str(warm), "--kinds", "depth_causal", "--assets", str(tmp_path / "elsewhere")])
