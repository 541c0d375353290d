"""Training on several processes (torch.distributed, gloo on these CPUs), started by torchrun as a user would:
the same loss curve as one process for the same global batch, a run resumed at another world size, online
features equal to cached ones, and a killed rank ending the run with one line and the last state intact."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from portable_spec.core.fixtures import target_dir
from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training import parallel
from portable_spec.training.batches import ReplyBatches
from portable_spec.training.config import DrafterShape
from portable_spec.training.drafter_shape import build_config
from portable_spec.training.features import FeatureDataset
from portable_spec.training.loss import drafter_loss
from portable_spec.training.parallel import Ranks, from_environment
from portable_spec.training.replies import load_sequences
from portable_spec.training.state import initial_drafter

ARGS = [
    "--target", "fixture", "--num-prompts", "40", "--max-new-tokens", "24", "--block-size", "4", "--num-hidden-layers", "1",
    "--seq-len", "48", "--anchors-per-seq", "4", "--heldout-eval-prompts", "4", "--eval-blocks", "4",
    "--reply-batch-size", "16", "--lr", "3e-3", "--warmup-steps", "2",
]  # fmt: skip


def _conversations(path: Path) -> Path:
    words = "def class return import self value list dict print for while if else try except with open".split()
    items = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": " ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 7))},
                {"from": "gpt", "value": "ok"},
            ],
        }
        for i in range(120)
    ]
    path.write_text(json.dumps(items))
    return path


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _train(work: Path, out: Path, *extra: str, ranks: int = 1, wait: bool = True):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    command = [*(launcher if ranks > 1 else [sys.executable]), "-m", "portable_spec.cli", "train", *ARGS]
    command += ["--work-dir", str(work), "--out", str(out), *extra]
    if not wait:
        return subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _curve(work: Path, out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (work / f"{out.name}-loss.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A work dir with prompts, replies and cached features made once (one process)."""
    root = tmp_path_factory.mktemp("dist")
    work = root / "prepared"
    data = _conversations(root / "share.json")
    _train(work, root / "unused", "--kind", "depth_causal", "--data", str(data), "--until", "features")
    return work


def _copy(prepared: Path, tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    shutil.copytree(prepared, work)
    return work


@pytest.mark.slow  # torchrun, or the train CLI in a subprocess
@pytest.mark.parametrize("kind", ["depth_causal", "parallel"])
def test_two_ranks_with_accumulation_train_the_curve_of_one_process(prepared, tmp_path, kind):
    """Global batch 8: one process x 8 rows, and 2 ranks x 2 accumulated micro-batches x 2 rows."""
    steps = ["--kind", kind, "--batch-size", "8", "--steps", "6", "--save-every", "3"]
    one, two = _copy(prepared, tmp_path, "one"), _copy(prepared, tmp_path, "two")
    _train(one, tmp_path / "one" / "dc", *steps)
    done = _train(two, tmp_path / "two" / "dc", *steps, "--grad-accum", "2", ranks=2)
    assert "global batch 8 = 2 rows x 2 rank(s) x 2 accumulation" in done.stdout
    single, double = _curve(one, one / "dc"), _curve(two, two / "dc")
    assert len(single) == 6 and single[-1] < single[0]
    assert double == pytest.approx(single, rel=1e-4, abs=1e-4)
    from safetensors.torch import load_file

    a, b = load_file(str(one / "dc" / "model.safetensors")), load_file(str(two / "dc" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)


@pytest.mark.slow  # torchrun, or the train CLI in a subprocess
@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_a_two_rank_run_resumed_in_one_process_continues_the_curve(prepared, tmp_path, layout):
    """fsdp: the drafter and the target's layers sharded over the 2 ranks (FSDP2); the state on disk is whole."""
    steps = ["--kind", "depth_causal", "--batch-size", "8", "--save-every", "2", "--feature-mode", "online"]
    steps += ["--draft-vocab-size", "512"]  # its d2t buffer travels whole through the sharded saves
    sharded = ["--drafter-parallel", "fsdp", "--target-parallel", "fsdp"] if layout == "fsdp" else []
    one, split = _copy(prepared, tmp_path, "one"), _copy(prepared, tmp_path, "split")
    _train(one, one / "dc", *steps, "--steps", "4")  # (the schedule follows --steps: both runs lengthen alike)
    _train(one, one / "dc", *steps, "--steps", "6")
    _train(split, split / "dc", *steps, *sharded, "--steps", "4", ranks=2)
    assert json.loads((split / "state-dc" / "trainer_state.json").read_text())["step"] == 4
    assert _curve(split, split / "dc") == pytest.approx(_curve(one, one / "dc")[:4], rel=1e-4, abs=1e-4)
    _train(split, split / "dc", *steps, "--steps", "6")
    assert len(_curve(one, one / "dc")) == 6
    assert _curve(split, split / "dc") == pytest.approx(_curve(one, one / "dc"), rel=1e-4, abs=1e-4)
    from safetensors.torch import load_file

    a, b = load_file(str(one / "dc" / "model.safetensors")), load_file(str(split / "dc" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)


@pytest.mark.slow  # torchrun, or the train CLI in a subprocess
def test_online_features_give_the_loss_of_cached_ones(prepared):
    target = TargetModel.load(target_dir(), tokenizer=True)
    recipe = DrafterShape(kind="depth_causal", block_size=4, num_hidden_layers=1)
    config = build_config(target, target.tokenizer, recipe, "fixture")
    cached = FeatureDataset.load(prepared / "data", config.target_layer_ids, target.fingerprint)
    online = FeatureDataset(load_sequences(prepared / "data"), None)
    usable = cached.trainable(4, 48)
    draws = [
        ReplyBatches(dataset, usable, 6, 4, 4, 48, seed=3, target=target, layer_ids=config.target_layer_ids)
        for dataset in (cached, online)
    ]
    drafter = initial_drafter(target, config, 0)
    for step in (0, 5):
        (tokens, from_cache, anchors), (tokens2, computed, anchors2) = draws[0](step), draws[1](step)
        assert torch.equal(tokens, tokens2) and torch.equal(anchors, anchors2)
        assert torch.allclose(computed.bfloat16().float(), from_cache, atol=2e-2, rtol=1e-2)  # cached in bf16
        with torch.no_grad():
            loss_cached = drafter_loss(drafter, from_cache, tokens, anchors, 7.0)
            loss_online = drafter_loss(drafter, computed, tokens, anchors, 7.0)
        assert float(loss_online) == pytest.approx(float(loss_cached), rel=1e-3)
    # a rank's rows of a global batch are those rows of the whole batch
    tokens, features, anchors = draws[0](2)
    rows = [draws[0](2, Ranks(r, 3).micro_rows(6, 1, 0)) for r in range(3)]
    assert torch.equal(torch.cat([r[2] for r in rows]), anchors)
    for (part_tokens, part_features, _), start in zip(rows, (0, 2, 4)):
        width = part_tokens.shape[1]
        assert torch.equal(part_tokens, tokens[start : start + 2, :width])
        assert torch.equal(part_features, features[start : start + 2, :width])


def test_a_pass_visits_every_sequence_once_whatever_the_batch():
    usable = list(range(10, 33))
    draw = ReplyBatches(None, usable, 5, 4, 2, 48, seed=1)  # picks read no data
    first_passes = [i for step in range(len(usable) * 2 // 5 + 1) for i in draw.picks(step)][: 2 * len(usable)]
    assert sorted(first_passes[: len(usable)]) == usable and sorted(first_passes[len(usable) :]) == usable
    assert first_passes[: len(usable)] != first_passes[len(usable) :]  # each pass in its own order
    again = ReplyBatches(None, usable, 5, 4, 2, 48, seed=1)
    assert again.picks(7) == draw.picks(7)  # a batch is a function of (seed, step): resumes draw it again


def test_rank_rows_split_the_global_batch_exactly():
    for world, accum in ((1, 1), (2, 2), (4, 1), (3, 2)):
        batch = 12 * world * accum
        rows = [
            list(range(batch))[Ranks(rank, world).micro_rows(batch, accum, micro)]
            for rank in range(world)
            for micro in range(accum)
        ]
        assert sorted(i for r in rows for i in r) == list(range(batch))
    with pytest.raises(SpecError, match=r"--batch-size 10 .* 4 equal micro-batches; use a multiple of 4"):
        parallel.check_batch(Ranks(0, 2), 10, 2)


def test_torchrun_environment_is_read_and_checked():
    assert from_environment({}) == Ranks()
    assert from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == Ranks(3, 4, 1)
    with pytest.raises(SpecError, match="RANK=4 is outside WORLD_SIZE=4"):
        from_environment({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(SpecError, match="not integers"):
        from_environment({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(SpecError, match="--device cuda:1: with 2 ranks each one takes GPU LOCAL_RANK"):
        parallel.rank_device(torch.device("cuda:1"), Ranks(0, 2))
    assert parallel.rank_device(torch.device("cuda"), Ranks(1, 2, 1)) == torch.device("cuda", 1)


@pytest.mark.slow  # torchrun, or the train CLI in a subprocess
def test_bad_flags_under_torchrun_give_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "portable_spec.cli", "train",
         *ARGS, "--kind", "parallel", "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "o"),
         "--batch-size", "7"],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and errors == [
        "error: --batch-size 7 (the global batch) does not split into 2 ranks x --grad-accum 1 = 2 equal "
        "micro-batches; use a multiple of 2"
    ]


@pytest.mark.slow  # torchrun, or the train CLI in a subprocess
def test_a_killed_rank_ends_the_run_with_one_line_and_the_state_intact(prepared, tmp_path):
    work = _copy(prepared, tmp_path, "killed")
    run = _train(work, work / "dc", "--kind", "depth_causal", "--batch-size", "8", "--steps", "100000",
                 "--save-every", "5", "--eval-every", "1000", ranks=2, wait=False)  # fmt: skip
    state = work / "state-dc" / "trainer_state.json"
    deadline = time.monotonic() + 120
    while not state.exists() and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.2)
    assert state.exists(), "no training state was saved"
    rank_one = [pid for pid in _children(run.pid) if "\0RANK=1\0" in _environ(pid)]
    assert len(rank_one) == 1
    os.kill(rank_one[0], signal.SIGKILL)
    output, _ = run.communicate(timeout=120)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert run.returncode != 0 and len(errors) == 1, output[-3000:]
    # which comes first depends on the machine's load: gloo seeing the peer's socket close, or torchrun's SIGTERM
    assert errors[0].startswith("error: rank 0 of 2: ") and "is intact" in errors[0]
    assert "another rank left the run" in errors[0] or "because another rank failed" in errors[0]
    saved = json.loads(state.read_text())
    assert saved["step"] % 5 == 0 and saved["step"] >= 5
    assert f"training state of step {saved['step']}" in errors[0]
    assert not (work / "dc").exists()  # the checkpoint is written only at the end
    assert not [p for p in work.iterdir() if p.name.startswith((".state-dc.tmp-", ".state-dc.old-"))]  # none half-done


def _children(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry.name))
                    todo.append(int(entry.name))
    return found


def _environ(pid: int) -> str:
    try:
        return "\0" + Path(f"/proc/{pid}/environ").read_text() + "\0"
    except OSError:
        return ""


@pytest.mark.slow  # torchrun, or the train CLI in a subprocess
def test_rank_variables_without_torchrun_or_peers_end_in_one_line(tmp_path):
    """WORLD_SIZE=2 set by hand, no torchrun, no second rank: the run says so once the join time is up, instead of
    waiting in the rendezvous for the 2 h collective timeout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _env() | {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PORTABLE_SPEC_JOIN_SECONDS": "3",
    }
    env.pop("TORCHELASTIC_RUN_ID", None)
    done = subprocess.run(
        [sys.executable, "-m", "portable_spec.cli", "train", *ARGS, "--kind", "parallel",
         "--data", str(_conversations(tmp_path / "c.json")), "--work-dir", str(tmp_path / "w"),
         "--out", str(tmp_path / "o")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(errors) == 1 and "WORLD_SIZE=2, RANK=0: the other ranks did not join" in errors[0]
    assert "within 3 s" in errors[0] and not (tmp_path / "o").exists()


BLOCKED_RANK = """
import sys, time, torch, torch.distributed as dist
from portable_spec.training import parallel
ranks = parallel.from_environment()
parallel.start(ranks, torch.device("cpu"))
print("ready", flush=True)
if ranks.rank == 1:
    dist.barrier()  # blocks inside gloo: rank 0 never joins it
time.sleep(120)
"""


def test_a_rank_blocked_in_a_collective_ends_on_sigterm_with_one_line(tmp_path):
    """Issue 47: when rank 0 died, torchrun's SIGTERM reached the surviving rank inside a collective, where Python
    runs no signal handler: it printed nothing and was killed 30 s later."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BLOCKED_RANK],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        for proc in procs:
            while (line := proc.stdout.readline()) and line.strip() != "ready":  # after "waiting for 2 ranks"
                pass
            assert line.strip() == "ready"
        time.sleep(1)  # rank 1 is inside the barrier
        procs[1].send_signal(signal.SIGTERM)
        _, err = procs[1].communicate(timeout=parallel.STOP_GRACE_SECONDS + 20)  # torchrun would wait 30 s
    finally:
        for proc in procs:
            proc.kill()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert procs[1].returncode == 1 and len(lines) == 1, err
    assert "rank 1: stopped by torchrun because another rank failed" in lines[0]
