"""Bad inputs, one table: every case exits non-zero with one `error:` line naming the field or file (no traceback
without --debug), and changes no file it did not create. docs/errors.md is rendered from this same table and the
messages the cases produce; regenerate it with
    PORTABLE_SPEC_WRITE_ERRORS_DOC=1 python -m pytest tests/test_bad_inputs.py
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from fixture_training import train_drafter
from safetensors.torch import load, save_file

import portable_spec
from portable_spec.cli import main
from portable_spec.core import fixtures
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.outputs import LOCK_FILE, WORK_DIR_KIND, write_marker
from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"


@dataclass(frozen=True)
class Case:
    name: str  # what the user did, as the docs show it
    argv: tuple[str, ...] = ()  # a CLI call, with {placeholders} from the `paths` fixture
    api: Callable | None = None  # or an API call: f(paths, target) that must raise SpecError
    expect: str = ""  # regex the one-line message must match (the field or file it names)
    status: int = 2


def gen(*extra: str) -> tuple[str, ...]:
    return ("generate", "hello", "--target", "{target}", *extra)


def _api_prompt_tensor(paths, target):
    SpeculativeDecoder(target).generate(torch.tensor([[1, 2]]), GenerationConfig(max_new_tokens=2))


def _api_prompt_text(paths, target):
    SpeculativeDecoder(target).generate(["def main():"], GenerationConfig(max_new_tokens=2))


def _api_prompt_tensors(paths, target):
    SpeculativeDecoder(target).generate([torch.tensor([1, 2])], GenerationConfig(max_new_tokens=2))


def _api_prompt_array(paths, target):
    import numpy as np

    SpeculativeDecoder(target).generate(np.array([[1, 2]]), GenerationConfig(max_new_tokens=2))


def _api_stop_outside_vocab(paths, target):
    SpeculativeDecoder(target).generate([[1, 2]], GenerationConfig(max_new_tokens=2, stop_token_ids=(10**9,)))


def _api_past_positions(paths, target):
    SpeculativeDecoder(target).generate([[1] * 2040], GenerationConfig(max_new_tokens=64))


def _api_prompt_float(paths, target):
    SpeculativeDecoder(target).generate([[1, 3.7]], GenerationConfig(max_new_tokens=2))


def _api_request_id(paths, target):
    SpeculativeDecoder(target).generate([[1, 2]], GenerationConfig(max_new_tokens=2), request_ids=[2**40])


def _api_no_prompts(paths, target):
    SpeculativeDecoder(target).generate([], GenerationConfig(max_new_tokens=2))


def _api_stream_short(paths, target):
    config = target.load_drafter(paths["dc"]).config
    train_drafter(target, config, torch.arange(5), TrainConfig(steps=1, seq_len=32), paths["out"], progress=False)


def _api_stream_vocab(paths, target):
    config = target.load_drafter(paths["dc"]).config
    train_drafter(
        target, config, torch.full((64,), 10**6), TrainConfig(steps=1, seq_len=32), paths["out"], progress=False
    )


def _api_stream_float(paths, target):
    config = target.load_drafter(paths["dc"]).config
    train_drafter(target, config, torch.rand(64), TrainConfig(steps=1, seq_len=32), paths["out"], progress=False)


def _trained_state(paths, target, kind: str) -> tuple:
    """A one-step training state under paths['state'] for `kind`, then the config asked for on resume."""
    config = target.load_drafter(paths[kind]).config
    train_drafter(
        target,
        config,
        torch.arange(200) % 200,
        TrainConfig(steps=1, seq_len=32, anchors_per_seq=4),
        paths["out"] / "first",
        state_dir=paths["state"],
        progress=False,
    )
    return config


def _api_resume_other_kind(paths, target):
    _trained_state(paths, target, "dc")
    other = target.load_drafter(paths["par"]).config
    train_drafter(
        target,
        other,
        torch.arange(200) % 200,
        TrainConfig(steps=2, seq_len=32, anchors_per_seq=4),
        paths["out"],
        state_dir=paths["state"],
        progress=False,
    )


def _api_resume_other_lr(paths, target):
    config = _trained_state(paths, target, "dc")
    train_drafter(
        target,
        config,
        torch.arange(200) % 200,
        TrainConfig(steps=2, seq_len=32, anchors_per_seq=4, lr=1e-4),
        paths["out"],
        state_dir=paths["state"],
        progress=False,
    )


def _api_resume_corrupt(paths, target):
    config = _trained_state(paths, target, "dc")
    (paths["state"] / "trainer_state.json").write_text("{not json")
    train_drafter(
        target,
        config,
        torch.arange(200) % 200,
        TrainConfig(steps=2, seq_len=32, anchors_per_seq=4),
        paths["out"],
        state_dir=paths["state"],
        progress=False,
    )


def _api_seq_len(paths, target):
    config = target.load_drafter(paths["dc"]).config
    train_drafter(
        target, config, torch.arange(200) % 200, TrainConfig(steps=1, seq_len=16), paths["out"], progress=False
    )


EXPORT_ONNX = ("export", "onnx", "{dc}")
EXPORT_TRT = ("export", "trtllm", "{par}")
TRAIN = (
    "train",
    "--target",
    "{target}",
    "--kind",
    "parallel",
    "--out",
    "{out}",
    "--work-dir",
    "{out}-work",
    "--data",
    "{sharegpt}",  # a readable data set: the data is checked first, before the target loads
)

CASES = [
    # -- targets --------------------------------------------------------------------------------------------
    Case("generate --target MISSING_DIR", gen()[:3] + ("{missing}",), expect=r"target=.*missing: not found"),
    Case("generate --target A_FILE", gen()[:3] + ("{file}",), expect=r"target=.*: is a file"),
    Case(
        "generate --target DIR_WITH_BAD_CONFIG_JSON",
        gen()[:3] + ("{bad_json_target}",),
        expect=r"config\.json: not valid JSON",
    ),
    Case(
        "generate --target DIR_WITHOUT_WEIGHTS",
        gen()[:3] + ("{no_weights_target}",),
        expect=r"target=.*: transformers could not load it",
    ),
    Case("generate --target DRAFTER_DIR", gen()[:3] + ("{dc}",), expect=r"is a portable-spec drafter checkpoint"),
    Case(
        "generate --target TARGET_WITH_100000_LAYERS",
        gen()[:3] + ("{huge_target}",),
        expect=r"num_hidden_layers=100000 is outside \[1, 1024\]",
    ),
    Case(
        "generate --target TARGET_WITH_VOCAB_SIZE_-5",
        gen()[:3] + ("{negative_vocab_target}",),
        expect=r"vocab_size=-5 is outside",
    ),
    Case(
        "generate --target TARGET_WITH_ROPE_THETA_INFINITY",
        gen()[:3] + ("{infinite_rope_target}",),
        expect=r"rope_theta=inf must be a finite positive number",
    ),
    Case(
        "generate --target WEIGHTS_HEADER_CLAIMING_4_TIB",
        gen()[:3] + ("{huge_header_target}",),
        expect=r"target=.*: transformers could not load it \(Error while deserializing header",
    ),
    Case("generate --target SYMLINK_LOOP", gen()[:3] + ("{loop}",), expect=r"a broken symlink or a symlink loop"),
    Case(
        "generate --target BERT_DIR (encoder-only)",
        gen()[:3] + ("{bert}",),
        expect=r"architectures=\['BertForMaskedLM'\] is not a decoder-only causal LM",
    ),
    Case(
        "generate --target TARGET_WITH_A_MISSING_WEIGHT",
        gen()[:3] + ("{partial_target}",),
        expect=r"weights do not match its config \(missing_keys: \['model\.norm\.weight'\]",
    ),
    Case(
        "generate --target TOKENIZER_WITHOUT_EOS",
        gen()[:3] + ("{no_eos_target}",),
        expect=r"target=.*: its tokenizer has no EOS token id, so generation could not stop",
    ),
    # -- sampling and generation options (refused before any model loads) ------------------------------------
    Case("generate --temperature -1", gen("--temperature", "-1"), expect=r"sampling\.temperature=-1\.0"),
    Case("generate --temperature nan", gen("--temperature", "nan"), expect=r"sampling\.temperature=nan"),
    Case("generate --temperature inf", gen("--temperature", "inf"), expect=r"sampling\.temperature=inf"),
    Case("generate --top-p 0", gen("--top-p", "0"), expect=r"sampling\.top_p=0\.0"),
    Case("generate --top-p 1.5", gen("--top-p", "1.5"), expect=r"sampling\.top_p=1\.5"),
    Case("generate --top-k -1", gen("--top-k", "-1"), expect=r"sampling\.top_k=-1"),
    Case("generate --top-k 2**40", gen("--top-k", str(2**40)), expect=r"sampling\.top_k=1099511627776"),
    Case("generate --max-new-tokens 0", gen("--max-new-tokens", "0"), expect=r"max_new_tokens=0"),
    Case("generate --seed -1", gen("--seed", "-1"), expect=r"seed=-1"),
    Case("generate --seed 2**64", gen("--seed", str(2**64)), expect=r"seed=18446744073709551616"),
    Case("generate --draft-confidence 1", gen("--draft-confidence", "1"), expect=r"draft_confidence=1\.0"),
    Case(
        "generate --drafter D --num-draft-tokens 0",
        gen("--drafter", "{dc}", "--num-draft-tokens", "0"),
        expect=r"num_draft_tokens=0",
    ),
    Case(
        "generate --drafter D --num-draft-tokens 99 (block 16)",
        gen("--drafter", "{dc}", "--num-draft-tokens", "99"),
        expect=r"num_draft_tokens=99 does not fit block_size=16",
    ),
    Case("generate ''  (empty prompt)", ("generate", "", "--target", "{target}"), expect=r"prompt='':"),
    # -- drafter checkpoints -----------------------------------------------------------------------------------
    Case("generate --drafter MISSING_DIR", gen("--drafter", "{missing}"), expect=r"missing: not found"),
    Case(
        "generate --drafter DIR_WITH_BAD_CONFIG_JSON",
        gen("--drafter", "{bad_json_drafter}"),
        expect=r"config\.json: not valid JSON",
    ),
    Case(
        "generate --drafter DIR_WHOSE_config.json_IS_A_DIRECTORY",
        gen("--drafter", "{config_dir_drafter}"),
        expect=r"config\.json: is a directory",
    ),
    Case(
        "generate --drafter DIR_WHOSE_model.safetensors_IS_A_DIRECTORY",
        gen("--drafter", "{weights_dir_drafter}"),
        expect=r"model\.safetensors: is a directory",
    ),
    Case(
        "generate --drafter TRUNCATED_model.safetensors",
        gen("--drafter", "{truncated_drafter}"),
        expect=r"model\.safetensors: not a readable safetensors file",
    ),
    Case(
        "generate --drafter PICKLE_SAVED_AS_model.safetensors",
        gen("--drafter", "{pickle_drafter}"),
        expect=r"model\.safetensors: not a readable safetensors file .*pickles are never loaded",
    ),
    Case(
        "generate --drafter DRAFTER_OF_ANOTHER_TARGET",
        gen("--drafter", "{foreign_drafter}"),
        expect=r"fingerprint|trained for",
    ),
    Case("check DRAFTER_WITH_NAN_WEIGHTS", ("check", "{nan_drafter}"), expect=r"non-finite values .*fc\.weight"),
    Case("check DRAFTER_WITH_FLOAT64_WEIGHTS", ("check", "{f64_drafter}"), expect=r"unexpected dtypes .*float64"),
    Case("check MISSING_DIR", ("check", "{missing}"), expect=r"missing: not found"),
    Case(
        "check DRAFTER whose config.json carries another kind's engine key",
        ("check", "{engine_key_drafter}"),
        expect=r"sample_from_anchor = True means nothing for variant parallel",
    ),
    Case(
        "export gguf DFLASH2 whose selector lattice is wider than llama.cpp's row",
        ("export", "gguf", "{dflash2}", "{out}", "--target", "{target}", "--target-gguf", "{missing}"),
        expect=r"selector_top_k=16 needs hidden_size >= 272 in llama\.cpp .* lower variant\.selector_top_k",
    ),
    Case(
        "check --target T DRAFTER_WITH_D2T_OUTSIDE_THE_VOCABULARY",
        ("check", "{bad_d2t_drafter}", "--target", "{target}"),
        expect=r"d2t: needs 64 distinct ids in \[0, 2048\), got 64 ids .* to 1000063",
    ),
    Case(
        "generate --drafter DRAFTER_WITH_NAN_WEIGHTS",
        gen("--drafter", "{nan_drafter}"),
        expect=r"non-finite values .*fc\.weight",
    ),
    Case(
        "export onnx DRAFTER_WITH_NAN_WEIGHTS OUT",
        ("export", "onnx", "{nan_drafter}", "{out}", "--target", "{target}"),
        expect=r"non-finite values .*fc\.weight",
    ),
    # -- output directories ---------------------------------------------------------------------------------------
    Case(
        "export onnx D D  (output = the drafter)",
        EXPORT_ONNX + ("{dc}", "--target", "{target}"),
        expect=r"output .* is the input",
    ),
    Case(
        "export onnx D TARGET/sub  (output inside the target)",
        EXPORT_ONNX + ("{target}/sub", "--target", "{target}"),
        expect=r"output .*sub is inside the input",
    ),
    Case(
        "export onnx D NON_EMPTY_USER_DIR",
        EXPORT_ONNX + ("{user}", "--target", "{target}"),
        expect=r"output .* is not empty and holds files portable-spec did not write",
    ),
    Case("export onnx D A_FILE", EXPORT_ONNX + ("{file}", "--target", "{target}"), expect=r"output .* is a file"),
    Case(
        "export onnx D OUT --opset 5", EXPORT_ONNX + ("{out}", "--target", "{target}", "--opset", "5"), expect=r"opset"
    ),
    Case(
        "export trtllm P TARGET --target TARGET",
        EXPORT_TRT + ("{target}", "--target", "{target}", "--trtllm-version", "1.3.0"),
        expect=r"output .* is the input",
    ),
    Case(
        "export trtllm P OUT --num-draft-tokens 0",
        EXPORT_TRT + ("{out}", "--target", "{target}", "--trtllm-version", "1.3.0", "--num-draft-tokens", "0"),
        expect=r"num_draft_tokens=0",
    ),
    Case(
        "export trtllm P OUT --trtllm-version banana",
        EXPORT_TRT + ("{out}", "--target", "{target}", "--trtllm-version", "banana"),
        expect=r"trtllm_version='banana' is not a version",
    ),
    Case(
        "export trtllm DEPTH_CAUSAL OUT --trtllm-version 1.3.0",
        ("export", "trtllm", "{dc}", "{out}", "--target", "{target}", "--trtllm-version", "1.3.0"),
        expect=r"needs TensorRT-LLM >= 1\.4 .*found 1\.3\.0",
    ),
    Case(
        "bench decode --out A_FILE",
        ("bench", "decode", "--target", "fixture", "--out", "{file}"),
        expect=r"output .* is a file; pass a directory path",
    ),
    # -- demo and train options (refused before any model loads) ---------------------------------------------
    Case("demo --prompts 0", ("demo", "--prompts", "0"), expect=r"--prompts=0: must be at least 1"),
    Case("demo --batch-size 0", ("demo", "--batch-size", "0"), expect=r"--batch-size=0"),
    Case("demo --max-new-tokens 0", ("demo", "--max-new-tokens", "0"), expect=r"--max-new-tokens=0"),
    Case("demo --num-draft-tokens 0", ("demo", "--num-draft-tokens", "0"), expect=r"--num-draft-tokens=0"),
    Case(
        "train --seq-len 16 --block-size 16",
        TRAIN + ("--seq-len", "16", "--block-size", "16"),
        expect=r"seq_len=16 leaves 0 anchor positions for block_size=16",
    ),
    Case("train --lr 0", TRAIN + ("--lr", "0"), expect=r"--lr 0\.0"),
    Case(
        "train --max-new-tokens 2600 on a 2048-position target",
        TRAIN + ("--max-new-tokens", "2600"),
        expect=r"--max-new-tokens 2600 with --max-prompt-tokens 256 reach past the target's "
        r"max_position_embeddings=2048; use --max-new-tokens 1792 or less",
    ),
    Case(
        "train --max-new-tokens 10000000",
        TRAIN + ("--max-new-tokens", "10000000"),
        expect=r"--max-new-tokens 10000000 .* reach past the target's max_position_embeddings",
    ),
    Case(
        "train --target-layer-ids 9  (past the target; refused before any data stage)",
        TRAIN + ("--target-layer-ids", "9"),
        expect=r"target_layer_ids=\[9\] must lie in \[0, 2\]",
    ),
    Case(
        "train --mask-token-id 99999  (outside the vocabulary)",
        TRAIN + ("--mask-token-id", "99999"),
        expect=r"mask_token_id=99999 is outside the vocabulary",
    ),
    Case(
        "train --intermediate-size 10**12",
        TRAIN + ("--intermediate-size", str(10**12)),
        expect=r"training needs [\d,]+ GiB for its weights, gradients and optimizer, more than cpu's",
    ),
    Case("train --data MISSING_FILE", TRAIN[:-1] + ("{missing}",), expect=r"--data .*missing: not a file"),
    Case(
        "train --target-prompts 8 for a target without a chat template",
        TRAIN + ("--target-prompts", "8"),
        expect=r"--target-prompts: the target's tokenizer has no chat template",
    ),
    Case(
        "train --target-prompts -1",
        TRAIN + ("--target-prompts", "-1"),
        expect=r"--target-prompts -1: Input should be greater than or equal to 0",
    ),
    Case(
        "train --num-prompts 0",
        TRAIN + ("--num-prompts", "0"),
        expect=r"--num-prompts 0: Input should be greater than or equal to 1",
    ),
    Case(
        "generate NON_UTF8_PROMPT",
        ("generate", "caf\udce9", "--target", "{target}"),
        expect=r"prompt: not valid UTF-8 text",
    ),
    Case(
        "bench decode --drafter a=D1 --drafter a=D2  (one row name twice)",
        ("bench", "decode", "--target", "fixture", "--drafter", "a={dc}", "--drafter", "a={par}"),
        expect=r"the row name 'a' is already --drafter 'a=.*'; give each row its own NAME",
    ),
    Case(
        "bench decode --drafter a=D --out D  (the output is a drafter it benchmarks)",
        ("bench", "decode", "--target", "fixture", "--drafter", "a={dc}", "--out", "{dc}"),
        expect=r"output .*dc is the input .*dc",
    ),
    Case(
        "bench decode --drafter a=D --out D/results  (the output inside a drafter it benchmarks)",
        ("bench", "decode", "--target", "fixture", "--drafter", "a={dc}", "--out", "{dc}/results"),
        expect=r"output .*dc/results is inside the input .*dc",
    ),
    Case(
        "bench decode --block-sizes 100",
        ("bench", "decode", "--target", "fixture", "--block-sizes", "100"),
        expect=r"--block-sizes 100: larger than the block the drafters were trained with \(parallel: 16",
    ),
    Case("conformance --threads 0", ("conformance", "--threads", "0"), expect=r"--threads=0: must be at least 1"),
    Case(
        "conformance --output A_FOLDER",
        ("conformance", "--output", "{user}"),
        expect=r"--output .*user: is a directory; pass a file path",
    ),
    Case(
        "conformance --output USERS_FILE",
        ("conformance", "--output", "{file}"),
        expect=r"--output .*file\.txt: exists and is not a conformance report portable-spec wrote",
    ),
    Case(
        "bench kernels --kernel-repeats 0",
        ("bench", "kernels", "--kernel-repeats", "0"),
        expect=r"--kernel-repeats=0: must be at least 1",
    ),
    # -- nothing of the user's is deleted or overwritten (checked before any model loads) ------------------------
    Case(
        "export onnx PARENT/dc PARENT --force (output contains the input)",
        ("export", "onnx", "{parent}/dc", "{parent}", "--target", "{target}", "--force"),
        expect=r"output .*parent contains the input .*parent/dc",
    ),
    Case(
        "export onnx D A_FILE/sub (output under a file)",
        EXPORT_ONNX + ("{file}/sub", "--target", "{target}"),
        expect=r"output .*sub lies under .*file\.txt, which is a file",
    ),
    Case(
        "train --work-dir USER_FOLDER",
        TRAIN[:8] + ("{user}",) + TRAIN[9:],
        expect=r"--work-dir .*user: not empty and not a portable-spec work directory",
    ),
    Case(
        "train --out USERS_DRAFTER (saved by portable-spec elsewhere)",
        TRAIN[:6] + ("{my_drafter}",) + TRAIN[7:],
        expect=r"output .*my_drafter is not empty and holds a drafter written from elsewhere",
    ),
    Case(
        "train --out FIXTURE_DRAFTER (files portable-spec did not write)",
        TRAIN[:6] + ("{dc}",) + TRAIN[7:],
        expect=r"output .*dc is not empty and holds files portable-spec did not write",
    ),
    Case(
        "train --out D --work-dir D/work",
        TRAIN[:8] + ("{out}/work",) + TRAIN[9:],
        expect=r"--out .*out contains --work-dir .*out/work",
    ),
    Case("train --out D --work-dir D", TRAIN[:8] + ("{out}",) + TRAIN[9:], expect=r"--out .*out is --work-dir"),
    Case(
        "train on a --work-dir another run holds",
        TRAIN[:8] + ("{locked_work}",) + TRAIN[9:],
        expect=r"--work-dir .*locked_work is in use by another portable-spec run \(pid \d+",
    ),
    Case(
        "train --device cuda (no CUDA here)",
        TRAIN + ("--device", "cuda"),
        expect=r"--device cuda: this torch build "
        r"sees no CUDA device",
    ),
    Case("train --device banana", TRAIN + ("--device", "banana"), expect=r"--device 'banana': not a torch device"),
    Case(
        "train --reply-batch-size 0",
        TRAIN + ("--reply-batch-size", "0"),
        expect=r"--reply-batch-size 0: Input should be greater than or equal to 1",
    ),
    Case("train --time-budget 0", TRAIN + ("--time-budget", "0"), expect=r"--time-budget 0\.0"),
    # flags are named as typed, not as the config fields behind them (issue 47: `per_prompt`, `every`, `seed`)
    Case("train --replies-per-prompt 0", TRAIN + ("--replies-per-prompt", "0"), expect=r"--replies-per-prompt 0: "),
    Case("train --eval-every 0", TRAIN + ("--eval-every", "0"), expect=r"--eval-every 0\.0: Input should be greater"),
    Case("train --reply-seed -1", TRAIN + ("--reply-seed", "-1"), expect=r"--reply-seed -1: "),
    # dflash2's own sizes (issue 45)
    Case(
        "train --kind parallel --selector-rank 8",
        TRAIN + ("--selector-rank", "8"),
        expect=r"--selector-rank 8: only a dflash2 drafter has it",
    ),
    Case(
        "train --kind parallel --depthwise-shift-mix",
        TRAIN + ("--depthwise-shift-mix",),
        expect=r"--depthwise-shift-mix with --kind parallel: only a dflash2 drafter has it",
    ),
    Case(
        "train --kind dflash2 --draft-vocab-size 64",
        TRAIN[:4] + ("dflash2",) + TRAIN[5:] + ("--draft-vocab-size", "64"),
        expect=r"--draft-vocab-size 64: a dflash2 drafter scores the full vocabulary",
    ),
    Case(
        "train --kind dflash2 --conv-group-size 48 (the fixture target is 256 wide)",
        TRAIN[:4] + ("dflash2",) + TRAIN[5:] + ("--conv-group-size", "48"),
        expect=r"--conv-group-size 48 does not divide the target's hidden_size=256",
    ),
    # --config: a run file (issue 46)
    Case("train --config A_FILE (not JSON)", TRAIN + ("--config", "{file}"), expect=r"file\.txt: not valid JSON"),
    Case(
        "train --config RUN_FILE (unknown setting)",
        TRAIN + ("--config", "{run_file_typo}"),
        expect=r"--num-prompt 10: Extra inputs are not permitted",
    ),
    Case(
        "train --config RECIPE --kind autoregressive (the recipe has no such kind)",
        TRAIN[:4] + ("autoregressive",) + TRAIN[5:] + ("--config", "{recipe}"),
        expect=r"recipe\.json: --kind autoregressive: this recipe trains depth_causal, parallel; pass --kind",
    ),
    Case(
        "train --eval-blocks 32 (block 16)",
        TRAIN + ("--eval-blocks", "4", "32"),
        expect=r"--eval-blocks 32: measure blocks in 2\.\.16",
    ),
    # --init-from's weights and binding are checked before replies and features are made (issue 47)
    Case(
        "train --init-from DRAFTER_WITH_NAN_WEIGHTS",
        TRAIN + ("--init-from", "{nan_drafter}", "--kind", "depth_causal"),
        expect=r"non-finite values .*fc\.weight",
    ),
    Case(
        "train --init-from A_DRAFTER_OF_ANOTHER_TARGET",
        TRAIN + ("--init-from", "{foreign_drafter}", "--kind", "depth_causal"),
        expect=r"fingerprint",
    ),
    Case(
        "train --init-from A_DEPTH_CAUSAL_DRAFTER --kind parallel",
        TRAIN + ("--init-from", "{dc}"),
        expect=r"--init-from .*: another drafter than this run asks for \(kind: saved 'depth_causal', asked 'parallel'\)",
    ),
    # -- API ------------------------------------------------------------------------------------------------------
    Case("SpeculativeDecoder.generate([[1, 3.7]], ...)", api=_api_prompt_float, expect=r"prompts\[0\] holds 3\.7"),
    Case(
        'SpeculativeDecoder.generate(["def main():"], ...)  (text, not ids)',
        api=_api_prompt_text,
        expect=r"prompts\[0\] is a str, not a list of token ids \(text: tokenize it",
    ),
    Case(
        "SpeculativeDecoder.generate([torch.tensor([1, 2])], ...)",
        api=_api_prompt_tensors,
        expect=r"prompts\[0\] is a Tensor, not a list of token ids \(a tensor or array: pass prompt\.tolist\(\)\)",
    ),
    Case(
        "SpeculativeDecoder.generate(np.array([[1, 2]]), ...)",
        api=_api_prompt_array,
        expect=r"prompts is a ndarray; pass a list of token-id lists \(a tensor or array: prompts\.tolist\(\)\)",
    ),
    Case(
        "SpeculativeDecoder.generate(torch.tensor([[1, 2]]), ...)",
        api=_api_prompt_tensor,
        expect=r"prompts is a Tensor; pass a list of token-id lists",
    ),
    Case(
        "GenerationConfig(stop_token_ids=(10**9,))",
        api=_api_stop_outside_vocab,
        expect=r"stop_token_ids=\[1000000000\]: \[1000000000\] are outside the target's vocabulary",
    ),
    Case(
        "SpeculativeDecoder.generate(prompt of 2040 tokens, max_new_tokens=64)",
        api=_api_past_positions,
        expect=r"longest prompt \(2040 tokens\) \+ max_new_tokens=64 .* max_position_embeddings=2048",
    ),
    Case(
        "SpeculativeDecoder.generate(..., request_ids=[2**40])",
        api=_api_request_id,
        expect=r"request_ids\[0\]=1099511627776",
    ),
    Case("SpeculativeDecoder.generate([], ...)", api=_api_no_prompts, expect=r"prompts is empty"),
    Case("train_drafter(stream shorter than seq_len)", api=_api_stream_short, expect=r"stream has 5 tokens"),
    Case("train_drafter(stream with out-of-vocabulary ids)", api=_api_stream_vocab, expect=r"stream holds token ids"),
    Case("train_drafter(float stream)", api=_api_stream_float, expect=r"stream: a 1-D tensor of integer token ids"),
    Case("train_drafter(seq_len == block_size)", api=_api_seq_len, expect=r"seq_len=16 leaves 0 anchor positions"),
    Case(
        "resume training a depth_causal state as parallel",
        api=_api_resume_other_kind,
        expect=r"holds another training run .*variant: saved .*depth_causal.*asked .*parallel",
    ),
    Case("resume training with another --lr", api=_api_resume_other_lr, expect=r"lr: saved 0\.002, asked 0\.0001"),
    *(
        Case(
            f"import an upstream drafter with {what}",
            ("import", f"{{{name}}}", "{out}", "--target", "{target}"),
            expect=expect,
        )
        for name, what, expect in (
            (
                "up_sliding",
                "sliding-window layers but use_sliding_window false",
                r"use_sliding_window = false with sliding_attention layers: transformers then drops sliding_window",
            ),
            (
                "up_small_window",
                "a sliding window smaller than its block",
                r"sliding_window=2 is smaller than block_size=16.*cannot be imported",
            ),
            (
                "up_huge_window",
                "a sliding window of 10**30 positions",
                r"sliding_window=10{30} is past 2147483647.*cannot be imported",
            ),
            (
                "up_window_2_63",
                "a sliding window of 2**63 positions",
                r"sliding_window=9223372036854775808 is past 2147483647.*cannot be imported",
            ),
            (
                "up_dflash2",
                "a DFlash2 architecture without its convolution size",
                r"dflash_config\.conv_kernel_size = null must be a whole number: z-lab's DFlash2DraftModel reads it",
            ),
            ("up_unknown_key", "an unknown dflash_config switch", r"dflash_config\.gate_mode = .*not a DFlash switch"),
            (
                "up_scaled",
                "a logit scale (output_multiplier 2)",
                r"output_multiplier = 2\.0 has no portable equivalent",
            ),
            ("up_mask_pickle", "a pickled mask_embedding.pt", r"mask_embedding\.pt: .*pickles are never loaded"),
            ("up_pickle_only", "only pytorch_model.bin", r"only pickled weights \(pytorch_model\.bin\)"),
            ("up_no_layer_ids", "no dflash_config.target_layer_ids", r"dflash_config\.target_layer_ids is missing"),
            ("up_other_vocab", "another vocabulary size", r"vocab_size=4096 differs from target\.vocab_size=2048"),
            ("up_other_depth", "num_target_layers of another target", r"num_target_layers = 28, the target .* has 4"),
            (
                "up_own_embedding",
                "an embed_tokens of another width",
                r"weight embed_tokens\.weight has shape \(2048, 192\), config\.json implies \(2048, 256\)",
            ),
            (
                "up_other_width",
                "target_hidden_size of another target",
                r"target_hidden_size = 512, the target .* is 256",
            ),
            (
                "up_missing_weight",
                "a missing layer weight",
                r"lacks 1 weight\(s\) a parallel drafter with num_hidden_layers=2 needs: \['layers\.1\.mlp\.up_proj",
            ),
            ("up_xpress", "speculators_model_type xpress", r"speculators_model_type = \"xpress\" is not dflash"),
            (
                "up_aux_out_of_range",
                "aux layer ids past the target",
                r"target_layer_ids=\[0, 1, 9\] must lie in \[0, 2\]",
            ),
            ("par", "a portable checkpoint", r"already a portable-spec checkpoint"),
            ("up_nan", "NaN weights", r"non-finite values \(NaN or inf\) in \['fc\.weight'\]"),
            ("up_float_d2t", "a fractional d2t", r"d2t holds non-integer offsets"),
            ("up_inf_rope", "rope_theta Infinity", r"rope_theta=inf"),
            ("up_typed", "rope_parameters a string", r"rope_parameters = \"yarn\" must be an object"),
            # YaRN taken silently or ending in `unexpected ...` before (issue 47's weak classes)
            ("up_yarn_string", "a YaRN factor as a string", r"rope_parameters\.factor = \"4\" must be a number"),
            ("up_yarn_shrink", "a YaRN factor below 1", r"rope_parameters\.factor = 0\.5 must be >= 1"),
            (
                "up_yarn_zero",
                "a YaRN original length of 0",
                r"rope_parameters\.original_max_position_embeddings = 0 must be a whole number >= 1",
            ),
            (
                "up_yarn_disagree",
                "rope_scaling and rope_parameters that disagree",
                r"rope_scaling\.factor = 8\.0 disagrees with rope_parameters\.factor=4\.0: keep one",
            ),
            ("up_not_neox", "is_neox_style false", r"is_neox_style = false has no portable equivalent"),
            (
                "up_chunked",
                "a layer type other than full or sliding attention",
                r"layer_types = .*chunked_attention.* has chunked_attention layers: no portable equivalent",
            ),
        )
    ),
    Case(  # the target's shape is read from its config.json, before any weight loads (issue 47)
        "import a drafter of another target's width onto a target without weights",
        ("import", "{up_other_width}", "{out}", "--target", "{no_weights_target}"),
        expect=r"target_hidden_size = 512, the target .* is 256",
    ),
    Case(
        "import over a drafter that train wrote",
        ("import", "{up_zlab}", "{trained_drafter}", "--target", "{target}"),
        expect=r"holds a drafter written from .*work, not a previous drafter output",
    ),
    Case(
        "import into the upstream directory itself",
        ("import", "{up_zlab}", "{up_zlab}/portable", "--target", "{target}"),
        expect=r"output .*portable is inside the input",
    ),
    Case(
        "import with a --layout the config contradicts",
        ("import", "{up_zlab}", "{out}", "--target", "{target}", "--layout", "speculators"),
        expect=r"layout=speculators given, but config\.json is in the dflash layout",
    ),
    Case(
        "export speculators of a depth_causal drafter",
        ("export", "speculators", "{dc}", "{out}"),
        expect=r"variant=depth_causal cannot be expressed in the speculators format",
    ),
    Case(
        "resume training from a corrupt trainer_state.json",
        api=_api_resume_corrupt,
        expect=r"trainer_state\.json: corrupt training state",
    ),
]


def _copy_drafter(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Inputs, good and broken, built once; each case gets its own fresh output path on top."""
    root = tmp_path_factory.mktemp("bad-inputs")
    target, dc, par = fixtures.target_dir(), fixtures.drafter_dir("depth_causal"), fixtures.drafter_dir("parallel")
    paths = {
        "target": _copy_drafter(target, root / "target"),
        "dc": _copy_drafter(dc, root / "dc"),
        "par": _copy_drafter(par, root / "par"),
        "dflash2": _copy_drafter(fixtures.drafter_dir("dflash2"), root / "dflash2"),
        "missing": root / "missing",
    }
    broken = _copy_drafter(par, root / "engine_key_drafter")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "sample_from_anchor": True}))
    paths["engine_key_drafter"] = broken
    (root / "file.txt").write_text("not a model\n")
    words = "def class return import value list dict print for while".split()
    conversations = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": " ".join(words[i % 10 :] + words[: i % 10])}]}
        for i in range(40)
    ]
    (root / "sharegpt.json").write_text(json.dumps(conversations))
    paths["sharegpt"] = root / "sharegpt.json"
    paths["file"] = root / "file.txt"
    (root / "run-typo.json").write_text(json.dumps({"prompts": {"num_prompt": 10}}))
    paths["run_file_typo"] = root / "run-typo.json"
    paths["recipe"] = Path(portable_spec.__file__).parent / "assets" / "smollm2" / "recipe.json"
    (root / "user").mkdir()
    (root / "user" / "notes.txt").write_text("the user's own files\n")
    paths["user"] = root / "user"
    broken = root / "bad_json_target"
    shutil.copytree(target, broken)
    (broken / "config.json").write_text("{oops")
    paths["bad_json_target"] = broken
    broken = root / "no_weights_target"
    shutil.copytree(target, broken)
    (broken / "model.safetensors").unlink()
    paths["no_weights_target"] = broken
    broken = root / "partial_target"
    shutil.copytree(target, broken)
    weights = _read(broken / "model.safetensors")
    weights.pop("model.norm.weight")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    paths["partial_target"] = broken
    broken = root / "no_eos_target"
    shutil.copytree(target, broken)
    tokenizer_config = json.loads((broken / "tokenizer_config.json").read_text())
    del tokenizer_config["eos_token"]
    (broken / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    paths["no_eos_target"] = broken
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(
        BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(root / "bert")
    paths["bert"] = root / "bert"
    for name, damage in {
        "bad_json_drafter": lambda d: (d / "config.json").write_text("{oops"),
        "config_dir_drafter": lambda d: ((d / "config.json").unlink(), (d / "config.json").mkdir()),
        "weights_dir_drafter": lambda d: ((d / "model.safetensors").unlink(), (d / "model.safetensors").mkdir()),
        "truncated_drafter": lambda d: (d / "model.safetensors").write_bytes(
            (d / "model.safetensors").read_bytes()[:1000]
        ),
        "pickle_drafter": lambda d: torch.save(_read(d / "model.safetensors"), d / "model.safetensors"),
        "nan_drafter": lambda d: _rewrite(d, lambda w: {**w, "fc.weight": w["fc.weight"] * float("nan")}),
        "f64_drafter": lambda d: _rewrite(d, lambda w: {k: v.double() for k, v in w.items()}),
    }.items():
        damage(_copy_drafter(dc, root / name))
        paths[name] = root / name
    parent = root / "parent"
    _copy_drafter(dc, parent / "dc")
    (parent / "notes.txt").write_text("the user's notes beside their drafter\n")
    paths["parent"] = parent
    trained = _copy_drafter(dc, root / "trained_drafter")
    write_marker(trained, "drafter", owner=str(root / "some-run" / "work"))  # what train writes: its work dir owns it
    paths["trained_drafter"], paths["its_work_dir"] = trained, root / "some-run" / "work"
    bad_d2t = _copy_drafter(dc, root / "bad_d2t_drafter")  # a 64-id draft vocabulary whose d2t leaves the vocabulary
    config = json.loads((bad_d2t / "config.json").read_text())
    (bad_d2t / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 64}))
    d2t = torch.zeros(64, dtype=torch.int64)
    d2t[-1] = 10**6
    _rewrite(bad_d2t, lambda w: {**w, "d2t": d2t})
    paths["bad_d2t_drafter"] = bad_d2t
    mine = _copy_drafter(dc, root / "my_drafter")
    write_marker(mine, "drafter")  # saved by portable-spec through the API: no work dir owns it
    paths["my_drafter"] = mine
    locked_work = root / "locked_work"
    locked_work.mkdir()
    write_marker(locked_work, WORK_DIR_KIND)
    (locked_work / LOCK_FILE).write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": "now",
                "command": "portable-spec train (another)",
            }
        )
    )
    paths["locked_work"] = locked_work
    for name, change in {
        "huge_target": {"num_hidden_layers": 100000},
        "negative_vocab_target": {"vocab_size": -5},
        "infinite_rope_target": {"rope_parameters": {"rope_theta": float("inf"), "rope_type": "default"}},
    }.items():
        broken = root / name
        shutil.copytree(target, broken)
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps({**config, **change}))
        paths[name] = broken
    huge_header = root / "huge_header_target"  # a weights header claiming a 4 TiB tensor in a tiny file
    shutil.copytree(target, huge_header)
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            "model.norm.weight": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4 << 40]},
        }
    ).encode()
    (huge_header / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(64))
    paths["huge_header_target"] = huge_header
    (root / "loop").symlink_to(root / "loop")
    paths["loop"] = root / "loop"
    paths.update(_upstream_inputs(root / "upstream", par))
    foreign = _copy_drafter(dc, root / "foreign_drafter")
    config = json.loads((foreign / "config.json").read_text())
    config["target"]["fingerprint"] = "sha256:" + "0" * 64  # well-formed, another target's
    (foreign / "config.json").write_text(json.dumps(config))
    paths["foreign_drafter"] = foreign
    return paths


def _upstream_inputs(root: Path, parallel: Path) -> dict[str, Path]:
    """The parallel fixture in upstream layouts, each damaged one way (conformance/upstream_layouts.py writes them
    as z-lab/dflash and speculators do)."""
    from portable_spec.conformance.upstream_layouts import shape_of_portable, write_upstream
    from portable_spec.core.spec import read_config

    shape, weights = shape_of_portable(read_config(parallel)), _read(parallel / "model.safetensors")

    def config_change(**change):
        return lambda d: (d / "config.json").write_text(
            json.dumps({**json.loads((d / "config.json").read_text()), **change})
        )

    def dflash_change(**change):
        def edit(d):
            config = json.loads((d / "config.json").read_text())
            config["dflash_config"].update(change)
            (d / "config.json").write_text(json.dumps(config))

        return edit

    def drop_layer_ids(d):
        config = json.loads((d / "config.json").read_text())
        del config["dflash_config"]["target_layer_ids"]
        (d / "config.json").write_text(json.dumps(config))

    def weights_change(change):
        return lambda d: save_file(change(dict(weights)), d / "model.safetensors", metadata={"format": "pt"})

    zlab = {
        "up_zlab": lambda d: None,
        "up_sliding": config_change(
            layer_types=["sliding_attention", "full_attention"], sliding_window=64, use_sliding_window=False
        ),
        "up_small_window": config_change(
            layer_types=["sliding_attention", "full_attention"], sliding_window=2, use_sliding_window=True
        ),
        "up_huge_window": config_change(
            layer_types=["sliding_attention", "full_attention"], sliding_window=10**30, use_sliding_window=True
        ),
        "up_window_2_63": config_change(
            layer_types=["sliding_attention", "full_attention"], sliding_window=2**63, use_sliding_window=True
        ),
        "up_dflash2": config_change(architectures=["DFlash2DraftModel"]),
        "up_unknown_key": dflash_change(gate_mode="sigmoid"),
        "up_scaled": dflash_change(output_multiplier=2.0),
        "up_mask_pickle": lambda d: torch.save(torch.zeros(256), d / "mask_embedding.pt"),
        "up_pickle_only": lambda d: (
            torch.save(weights, d / "pytorch_model.bin"),
            (d / "model.safetensors").unlink(),
        ),
        "up_no_layer_ids": drop_layer_ids,
        "up_other_vocab": config_change(vocab_size=4096),
        "up_other_depth": config_change(num_target_layers=28),
        "up_own_embedding": weights_change(lambda w: {**w, "embed_tokens.weight": torch.randn(2048, 192)}),
        "up_other_width": config_change(target_hidden_size=512),
        "up_missing_weight": weights_change(
            lambda w: {k: v for k, v in w.items() if k != "layers.1.mlp.up_proj.weight"}
        ),
        "up_nan": weights_change(lambda w: {**w, "fc.weight": w["fc.weight"] * float("nan")}),
        "up_float_d2t": weights_change(lambda w: {**w, "d2t": torch.full((64,), 0.5)}),
        "up_inf_rope": config_change(rope_theta=float("inf")),
        "up_typed": config_change(rope_parameters="yarn"),
        "up_yarn_string": config_change(rope_parameters={**YARN, "factor": "4"}),
        "up_yarn_shrink": config_change(rope_parameters={**YARN, "factor": 0.5}),
        "up_yarn_zero": config_change(rope_parameters={**YARN, "original_max_position_embeddings": 0, "factor": 4.0}),
        "up_yarn_disagree": config_change(
            rope_parameters={**YARN, "factor": 4.0}, rope_scaling={**YARN, "factor": 8.0}
        ),
        "up_not_neox": config_change(is_neox_style=False),
        "up_chunked": config_change(layer_types=["chunked_attention", "full_attention"]),
    }
    speculators = {
        "up_xpress": config_change(speculators_model_type="xpress"),
        "up_aux_out_of_range": config_change(aux_hidden_state_layer_ids=[1, 2, 10]),
    }
    paths = {}
    for layout, damages in (("zlab", zlab), ("speculators", speculators)):
        for name, damage in damages.items():
            damage(write_upstream(layout, root / name, shape, weights))
            paths[name] = root / name
    return paths


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 32}


def _read(path: Path) -> dict[str, torch.Tensor]:
    """In memory, not memory-mapped: these files are rewritten in place."""
    return load(path.read_bytes())


def _rewrite(drafter: Path, change) -> None:
    save_file(change(_read(drafter / "model.safetensors")), drafter / "model.safetensors", metadata={"format": "pt"})


def _tree_hashes(paths: dict[str, Path]) -> dict[str, str]:
    hashes = {}
    for root in {p for p in paths.values() if not p.is_symlink() and p.exists()}:
        for file in sorted([root] if root.is_file() else root.rglob("*")):
            if file.is_file():
                hashes[str(file)] = hashlib.sha256(file.read_bytes()).hexdigest()
    return hashes


@pytest.fixture(scope="module")
def fixture_target() -> TargetModel:
    return TargetModel.load(fixtures.target_dir())


def _normalise(message: str, paths: dict[str, Path]) -> str:
    for name, path in sorted(paths.items(), key=lambda item: -len(str(item[1]))):
        message = message.replace(os.path.realpath(path), name.upper()).replace(str(path), name.upper())
    message = re.sub(r"pid \d+ on [^,]+,", "pid PID on HOST,", message)  # the lock holder: this test process
    return re.sub(r"\s+", " ", message)


OBSERVED: dict[str, tuple[int, str]] = {}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, built, fixture_target, tmp_path, capsys):
    paths = {**built, "out": tmp_path / "out", "state": tmp_path / "state"}
    before = _tree_hashes(built)
    if case.api is not None:
        with pytest.raises(SpecError) as raised:
            case.api(paths, fixture_target)
        status, message = 2, str(raised.value)
    else:
        argv = [arg.format(**{k: str(v) for k, v in paths.items()}) for arg in case.argv]
        try:
            status = main(argv)
        except SystemExit as exit_:  # argparse's own refusals
            status = exit_.code
        err = capsys.readouterr().err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1, err
        message = lines[0].removeprefix("error: ")
    assert status == case.status, message
    assert re.search(case.expect, message), message
    assert _tree_hashes(built) == before, "a bad input changed files it did not create"
    assert not (tmp_path / "out").exists() or case.api is not None
    OBSERVED[case.name] = (status, _normalise(message, paths))


def test_a_target_refused_for_its_tokenizer_never_loads_its_weights(built, monkeypatch):
    """TargetModel.load checks the directory and the tokenizer before the weights (the one target loader)."""

    def weights_loaded(*args, **kwargs):
        raise AssertionError("the target's weights were loaded before its tokenizer was refused")

    monkeypatch.setattr("portable_spec.core.target.load_causal_lm", weights_loaded)
    with pytest.raises(SpecError, match="no EOS token id"):
        TargetModel.load(built["no_eos_target"], tokenizer=True)


def test_generation_config_takes_integers_not_booleans():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_new_tokens"):
        GenerationConfig(max_new_tokens=True)
    with pytest.raises(ValidationError, match="stop_token_ids"):
        GenerationConfig(stop_token_ids=(-1,))


def test_table_has_forty_distinct_cases():
    assert len({c.name for c in CASES}) == len(CASES) >= 40


@pytest.mark.slow  # the installed console script, twice, in subprocesses
def test_console_script_prints_one_line_and_debug_the_traceback(tmp_path):
    """The installed entry point, in a real process: one `error:` line and exit 2; --debug adds the traceback."""
    argv = [sys.executable, "-m", "portable_spec.cli", "generate", "hi", "--target", str(tmp_path / "nope")]
    quiet = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert (
        quiet.returncode == 2 and quiet.stderr.strip().startswith("error: target=") and "Traceback" not in quiet.stderr
    )
    loud = subprocess.run(argv[:3] + ["--debug"] + argv[3:], capture_output=True, text=True, timeout=300)
    assert loud.returncode != 0 and "Traceback" in loud.stderr


def render_doc() -> str:
    lines = [
        "# Errors you can meet, and what they say",
        "",
        "Generated by `tests/test_bad_inputs.py` from its table of bad inputs: each row is a case that test runs, "
        "with the one line portable-spec printed (paths replaced by their role). Every CLI case exits with status "
        "2, every API case raises `portable_spec.core.spec.SpecError` (the CLI prints it as the same line), and no "
        "case changes a file it did not create; `portable-spec --debug <command>` shows the traceback. The fix "
        "is part of each message.",
        "",
        "| what was done | CLI exit / API | `error:` message |",
        "|---|---|---|",
    ]
    for case in CASES:
        status, message = OBSERVED[case.name]
        outcome = "raises SpecError" if case.api is not None else str(status)
        lines.append(f"| `{case.name}` | {outcome} | {message.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def test_errors_doc_is_current():
    """Runs after the table (file order): docs/errors.md must be what the cases printed."""
    if len(OBSERVED) != len(CASES):
        pytest.skip("the table did not run completely in this session (run the whole file)")
    rendered = render_doc()
    if os.environ.get("PORTABLE_SPEC_WRITE_ERRORS_DOC"):
        DOC.write_text(rendered)
    assert DOC.exists() and DOC.read_text() == rendered, (
        "docs/errors.md is stale: PORTABLE_SPEC_WRITE_ERRORS_DOC=1 python -m pytest tests/test_bad_inputs.py"
    )
