"""Prompts the target writes itself (training/target_prompts.py), with the fixture target through HF generate: the
chat template's user header and closing token, determinism per seed, what is kept, and the prompt stage."""

import json

import pytest
import torch
from transformers import AutoTokenizer

from portable_spec.core import fixtures
from portable_spec.core.spec import SpecError
from portable_spec.training.config import PromptConfig
from portable_spec.training.prompts import prepare_prompts
from portable_spec.training.replies import reply_writer
from portable_spec.training.sharegpt import chat_prompt_ids
from portable_spec.training.target_prompts import target_written_prompts, user_turn_template
from portable_spec.training.work_dir import WorkDir

# A template whose user turn closes with a newline: the fixture target (trained on Python source) ends lines often
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer(template):
    tokenizer = AutoTokenizer.from_pretrained(str(fixtures.target_dir()))
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def write():
    return reply_writer(fixtures.target_dir(), "hf", "cpu", torch.float32, 256, 16)


def test_user_turn_template():
    tokenizer = _tokenizer(CHATML)
    header, close = user_turn_template(tokenizer)
    assert tokenizer.decode(header) == "<|im_start|>user\n"
    assert tokenizer.decode([close]) == tokenizer.decode(tokenizer("<|im_end|>")["input_ids"][:1])
    with pytest.raises(SpecError, match="--target-prompts: the target's tokenizer has no chat template"):
        user_turn_template(_tokenizer(None))


def test_prompts_are_closed_distinct_templated_and_seeded(write):
    tokenizer = _tokenizer(TEMPLATE)
    _, close = user_turn_template(tokenizer)
    first = target_written_prompts(tokenizer, write, 12, seed=3, max_prompt_tokens=48, batch=16)
    assert len(first) == 12 and len({p["id"] for p in first}) == 12
    texts = []
    for prompt in first:
        text = tokenizer.decode(prompt["ids"]).removeprefix("user: ").removesuffix("\nassistant:")
        texts.append(text)
        assert text.strip() == text and text  # stripped, non-empty
        assert prompt["ids"] == chat_prompt_ids(tokenizer, (("user", text),))  # templated as any prompt
        assert len(prompt["ids"]) <= 48
    assert len(set(texts)) == len(texts)
    assert target_written_prompts(tokenizer, write, 12, seed=3, max_prompt_tokens=48, batch=16) == first
    assert target_written_prompts(tokenizer, write, 12, seed=4, max_prompt_tokens=48, batch=16) != first


def test_unfinished_requests_are_dropped(write):
    """A cap of 2 tokens closes almost no request: what comes back is only closed ones (none may be asked-for
    text cut at the cap), and the search stops after its rounds instead of looping."""
    tokenizer = _tokenizer(TEMPLATE)
    header, close = user_turn_template(tokenizer)
    prompts = target_written_prompts(tokenizer, write, 50, seed=0, max_prompt_tokens=2, batch=8)
    assert len(prompts) < 50
    raw = write([header] * 8, 2, None, close)
    assert any(row[-1] != close for row in raw)  # the cap does cut requests here


def test_prompt_stage_adds_them_to_the_train_prompts_only(tmp_path, write):
    tokenizer = _tokenizer(TEMPLATE)
    data = tmp_path / "chat.json"
    conversations = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i} about files"}]} for i in range(60)
    ]
    data.write_text(json.dumps(conversations))
    plain = PromptConfig(num_prompts=100, heldout_prompts=10, max_prompt_tokens=48)
    with_target = plain.model_copy(update={"target_prompts": 8})
    for name in ("plain", "grown"):
        (tmp_path / name).mkdir()  # run_recipe makes the work dir
    base = prepare_prompts(tokenizer, data, tmp_path / "plain", plain)
    grown = prepare_prompts(tokenizer, data, tmp_path / "grown", with_target, lambda: write, batch=16)
    assert len(grown) == len(base) + 8 and set(map(tuple, base)) < set(map(tuple, grown))
    plain_dir, grown_dir = WorkDir(tmp_path / "plain"), WorkDir(tmp_path / "grown")
    assert plain_dir.heldout_prompts.read_text() == grown_dir.heldout_prompts.read_text()
    ids = [entry["id"] for entry in json.loads(grown_dir.train_prompts.read_text())]
    assert sum(str(i).startswith("target-") for i in ids) == 8
    # fewer data prompts than prepared: a prefix of the data set's, and still every prompt the target wrote
    fewer = prepare_prompts(tokenizer, data, tmp_path / "grown", with_target.model_copy(update={"num_prompts": 20}))
    written = {tuple(p) for p in grown} - set(map(tuple, base))
    assert len(fewer) == 28 and written <= set(map(tuple, fewer))
    with pytest.raises(SpecError, match="target-prompts: prepared 8, asked 4"):
        prepare_prompts(tokenizer, data, tmp_path / "grown", with_target.model_copy(update={"target_prompts": 4}))


@pytest.mark.slow  # the train CLI in a subprocess
def test_train_cli_writes_target_prompts(tmp_path):
    """`portable-spec train --target-prompts N --until prompts` on a target whose tokenizer has a chat template."""
    import shutil
    import subprocess
    import sys

    target = tmp_path / "target"
    shutil.copytree(fixtures.target_dir(), target)
    settings = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": TEMPLATE}))
    data = tmp_path / "chat.json"
    data.write_text(
        json.dumps([{"id": f"c{i}", "conversations": [{"from": "human", "value": f"q {i}"}]} for i in range(40)])
    )
    work = tmp_path / "work"
    command = [sys.executable, "-m", "portable_spec.cli", "train", "--target", str(target), "--kind", "parallel"]
    command += ["--out", str(tmp_path / "drafter"), "--work-dir", str(work), "--data", str(data), "--until", "prompts"]
    command += ["--target-prompts", "6", "--max-prompt-tokens", "48", "--reply-batch-size", "16", "--generator", "hf"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the target wrote 6 of 6 asked" in done.stdout
    ids = [entry["id"] for entry in json.loads(WorkDir(work).train_prompts.read_text())]
    heldout = json.loads(WorkDir(work).heldout_prompts.read_text())
    assert sum(str(i).startswith("target-") for i in ids) == 6 and len(ids) == 6 + 40 - len(heldout)
