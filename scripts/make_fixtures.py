"""Regenerate the shipped fixtures: a small Qwen3 target trained on the Python stdlib, its tokenizer,
held-out prompts, and one drafter per kind. Deterministic given the Python version (its stdlib is the corpus).

    python scripts/make_fixtures.py --out portable_spec/assets            # everything (~30-40 min, 2 cores)
    python scripts/make_fixtures.py --out /tmp/fx --stage drafters          # drafters only, reusing the target
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sysconfig
import time
from pathlib import Path

import fixture_corpus as data
import torch
from fixture_training import train_drafter
from tqdm import tqdm
from transformers import Qwen3Config, Qwen3ForCausalLM

from portable_spec.core.outputs import write_dir_atomically
from portable_spec.core.target import TargetModel, drafter_config_for
from portable_spec.training.config import TrainConfig

TARGET = dict(
    vocab_size=2048,
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)
DRAFTERS = {  # kind -> layers; block 16 so the same drafter serves 3, 7 and 15 draft tokens
    "parallel": 2,
    "depth_causal": 2,
    "autoregressive": 1,
    "dflash2": 2,  # parallel's layers, speculators 0.9.0's convolution and selector defaults
    "dspark": 2,  # parallel's layers, speculators 0.9.0's DSpark defaults (vanilla Markov head, from the anchor)
    "domino": 2,  # parallel's layers, a Domino GRU correction (portable-spec's default sizes: SpecForge has none)
}
TARGET_LAYER_IDS = [0, 1, 2]
BLOCK_SIZE = 16


def corpus(max_train_bytes: int):
    root = Path(sysconfig.get_paths()["stdlib"])
    split = data.split_files(data.stdlib_files(root), root)
    return data.read_texts(split.train, max_train_bytes), data.read_texts(split.heldout, 10**9)


def train_target(out: Path, tokenizer, stream: torch.Tensor, heldout: torch.Tensor, steps: int, log: dict) -> None:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            **TARGET,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.eos_token_id,
        )
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3, weight_decay=0.01, betas=(0.9, 0.95))
    warmup, batch, seq_len = 30, 8, 256
    model.train()
    for step in (bar := tqdm(range(steps), desc="target")):
        lr = 4e-3 * min((step + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens = data.sample_windows(stream, seq_len, batch, torch.Generator().manual_seed(step))
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    model = model.to(torch.bfloat16)  # shipped in bf16 (half the bytes); loaded as float32 exactly
    with torch.no_grad():
        windows = data.sample_windows(heldout, seq_len, 16, torch.Generator().manual_seed(12345))
        log["target_heldout_loss"] = round(model.float()(input_ids=windows, labels=windows).loss.item(), 4)
    model = model.to(torch.bfloat16)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    write_dir_atomically(out, write, kind="fixtures")


def heldout_prompts(heldout: torch.Tensor, tokenizer, count: int = 64, length: int = 48) -> list[dict]:
    generator = torch.Generator().manual_seed(2026)
    starts = torch.randint(0, len(heldout) - length, (count,), generator=generator).tolist()
    return [
        {"ids": heldout[s : s + length].tolist(), "text": tokenizer.decode(heldout[s : s + length])} for s in starts
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stage", choices=["all", "target", "drafters"], default="all")
    parser.add_argument("--target-steps", type=int, default=300)
    parser.add_argument("--drafter-steps", type=int, default=250)
    parser.add_argument("--max-train-bytes", type=int, default=8_000_000)
    parser.add_argument("--kinds", nargs="*", default=list(DRAFTERS))
    args = parser.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "MANIFEST.json"
    log = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    log.update(python=platform.python_version(), torch=torch.__version__)

    texts, heldout_texts = corpus(args.max_train_bytes)
    if args.stage in ("all", "target"):
        tokenizer = data.train_tokenizer(texts, TARGET["vocab_size"])
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.out / "target")
    stream = data.token_stream(tokenizer, texts)
    heldout = data.token_stream(tokenizer, heldout_texts)
    log.update(train_tokens=len(stream), heldout_tokens=len(heldout))
    if args.stage in ("all", "target"):
        start = time.time()
        train_target(args.out / "target", tokenizer, stream, heldout, args.target_steps, log)
        log.update(target_steps=args.target_steps, target_seconds=round(time.time() - start))
        prompts = heldout_prompts(heldout, tokenizer)
        (args.out / "heldout_prompts.json").write_text(json.dumps(prompts, indent=0) + "\n")
        manifest_path.write_text(json.dumps(log, indent=2) + "\n")
    if args.stage in ("all", "drafters"):
        target = TargetModel.load(args.out / "target")
        target.model_id = "portable-spec/fixture-target"
        mask_id = tokenizer.convert_tokens_to_ids(data.MASK)
        for kind in args.kinds:
            start = time.time()
            config = drafter_config_for(
                target,
                kind=kind,
                block_size=BLOCK_SIZE,
                num_hidden_layers=DRAFTERS[kind],
                target_layer_ids=TARGET_LAYER_IDS,
                mask_token_id=mask_id,
            )
            train_config = TrainConfig(steps=args.drafter_steps, batch_size=6)
            train_drafter(
                target,
                config,
                stream,
                train_config,
                args.out / "drafters" / kind,
                state_dir=args.out.parent / f".train-state-{kind}",
            )
            log[f"{kind}_seconds"] = round(time.time() - start)
            log[f"{kind}_steps"] = args.drafter_steps
            manifest_path.write_text(json.dumps(log, indent=2) + "\n")


if __name__ == "__main__":
    main()
