"""The drafter training recipe for any HF causal LM, stage by stage, each resumable in one work directory:

prompts (ShareGPT-style, train split) -> the target's greedy replies -> cached target features -> draft vocabulary
-> drafter training (curve logged as JSON lines) -> checkpoint. `portable-spec train` runs it; the shipped
SmolLM2 drafters were made with it (see portable_spec/assets/smollm2/RECIPE.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from portable_spec.core.drafter import Drafter
from portable_spec.core.outputs import locked
from portable_spec.core.spec import DrafterConfig, SpecError, read_json_object
from portable_spec.core.target import TargetModel
from portable_spec.training import distributed
from portable_spec.training.batches import ReplyBatches
from portable_spec.training.distill_data import (
    Generator,
    ReplyConfig,
    generate_replies,
    load_sequences,
    pick_generator,
    reply_writer,
)
from portable_spec.training.distributed import SINGLE, Ranks
from portable_spec.training.feature_cache import FeatureDataset, cache_features
from portable_spec.training.feature_mode import FeatureMode, choose_features, device_memory
from portable_spec.training.heldout import HeldoutAcceptance, HeldoutTracker
from portable_spec.training.prompts import chat_prompt_split, length_bucketed, read_prompts, write_prompts
from portable_spec.training.sharegpt import PromptTurns
from portable_spec.training.target_prompts import Writer, is_target_written, target_written_prompts
from portable_spec.training.train import TrainConfig, autocast_for, drafter_config_for, train_loop
from portable_spec.training.work_dir import WorkDir, changed_settings


def dflash_target_layer_ids(num_target_layers: int, num_feature_layers: int) -> list[int]:
    """DFlash's choice (z-lab/dflash build_target_layer_ids): spread evenly over [1, L - 3]; the middle for one.
    A target too shallow for that many distinct layers there spreads over every usable layer, [0, L - 2]."""
    if num_feature_layers == 1:
        return [num_target_layers // 2]
    for start, end in ((1, num_target_layers - 3), (0, num_target_layers - 2)):
        ids = [int(round(start + i * (end - start) / (num_feature_layers - 1))) for i in range(num_feature_layers)]
        if end > start and len(set(ids)) == len(ids):
            return ids
    raise SpecError(
        f"a {num_target_layers}-layer target has fewer than {num_feature_layers} usable feature layers "
        f"(0..{num_target_layers - 2}); use --num-layers {max(num_target_layers - 1, 1)} or fewer, or pass "
        "--target-layer-ids"
    )


def mask_token_for(tokenizer, embedding_rows: int) -> int:
    """The tokenizer's mask token; else, as DFlash checkpoints for Qwen do, the first embedding row no token uses;
    else (a tokenizer that fills its embedding, as SmolLM2's) its unknown / <|endoftext|> token, rare in chat data."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    if len(tokenizer) < embedding_rows:
        return len(tokenizer)
    for token_id in (tokenizer.unk_token_id, tokenizer.bos_token_id):
        if token_id is not None:
            return int(token_id)
    raise SpecError(
        "the tokenizer has no mask, unknown or BOS token and no spare embedding row; "
        "pass --mask-token-id with a token id that never appears in replies"
    )


def frequent_tokens(data_dir: Path, size: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent reply tokens (plus `always`, e.g. EOS), sorted: EAGLE-3's draft vocabulary."""
    sequences = load_sequences(data_dir)
    counts: Counter[int] = Counter()
    for index in range(len(sequences)):
        counts.update(sequences.sequence(index)[int(sequences.prompt_lens[index]) :].tolist())
    chosen = [t for t in always if t is not None]
    for token, _ in counts.most_common():
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    fill = 0
    while len(chosen) < size:  # a tiny data set: pad with unused ids so the size is what was asked
        if fill not in chosen:
            chosen.append(fill)
        fill += 1
    return torch.tensor(sorted(chosen), dtype=torch.int64)


class RecipeConfig(BaseModel):
    """Data and model choices of one training run (train hyper-parameters live in TrainConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="Drafter kind (spec.VARIANT_KINDS).")
    block_size: int = Field(16, ge=2, description="Anchor + draft slots per block.")
    num_hidden_layers: int = Field(2, ge=1, description="Drafter layers.")
    intermediate_size: int | None = Field(None, ge=1, description="Drafter MLP width; None: the target's.")
    target_layer_ids: list[int] | None = Field(None, description="Feature layers; None: DFlash's spread.")
    draft_vocab_size: int | None = Field(8192, ge=1, description="Most frequent reply tokens scored; None: all.")
    mask_token_id: int | None = Field(None, ge=0, description="The block's mask token; None: mask_token_for.")
    num_prompts: int = Field(2000, ge=1, description="Train-split prompts distilled.")
    prompt_offset: int = Field(
        0, ge=0, description="Train-split prompts skipped first (a warm start on prompts an earlier run did not see)."
    )
    prompt_turns: PromptTurns = Field(
        "first", description="Human turns used as prompts: each conversation's first, or all."
    )
    prompt_context: bool = Field(False, description="Also each later turn with the turns before it (within the cap).")
    target_prompts: int = Field(
        0, ge=0, description="Prompts the target writes itself (Magpie: target_prompts.py) added to the train ones."
    )
    heldout_prompts: int = Field(256, ge=0, description="Held-out prompts written beside them for benchmarks.")
    max_prompt_tokens: int = Field(256, ge=1, description="Longer prompts are skipped.")
    max_new_tokens: int = Field(256, ge=1, description="Reply length when regenerating.")
    generator: Generator = Field("auto", description="Who regenerates replies: vllm, hf, or auto.")
    replies: ReplyConfig = Field(default_factory=ReplyConfig, description="Sampled replies beside the greedy one.")
    reply_batch_size: int = Field(64, ge=1, description="Prompts per generation call and per reply shard.")
    feature_batch_size: int = Field(4, ge=1, description="Sequences per target pass when caching features.")
    features: FeatureMode = Field(
        "auto", description="Target features cached on disk once, or computed online in each step; auto: by size."
    )
    heldout_eval_prompts: int = Field(
        32, ge=0, description="Held-out prompts whose greedy replies measure acceptance while training; 0: none."
    )


class EvalConfig(BaseModel):
    """Held-out acceptance while training (heldout.py): how often, at which blocks, when to stop early."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: float | None = Field(
        300.0, gt=0, allow_inf_nan=False, description="Seconds of training between evaluations; None: none."
    )
    blocks: tuple[int, ...] = Field((4, 16), min_length=1, description="Blocks measured; the first picks the best.")
    plateau: int | None = Field(None, ge=1, description="Stop after this many evaluations without a gain.")

    def check_blocks(self, block_size: int) -> None:
        """Held-out acceptance is measured at blocks the drafter can run: 2..block_size."""
        for block in self.blocks:
            if not 2 <= block <= block_size:
                raise SpecError(f"--eval-blocks {block}: measure blocks in 2..{block_size} (--block-size)")


PROMPT_FIELDS = (
    "prompt_turns",
    "prompt_context",
    "prompt_offset",
    "max_prompt_tokens",
    "heldout_prompts",
    "target_prompts",
)


def prepare_prompts(
    tokenizer,
    data_path: Path | None,
    work_dir: Path,
    recipe: RecipeConfig,
    target_writer: Callable[[], Writer] | None = None,
) -> list[list[int]]:
    """Train prompts (cached in work_dir): the data set's, then `recipe.target_prompts` the target writes
    (`target_writer()` makes the writer, only then); the held-out split is written beside them for benchmarks. A
    prepared work dir is reused only for the settings it was prepared with (else one error naming what changed)."""
    layout = WorkDir(work_dir)
    train_file, heldout_file, settings_file = layout.train_prompts, layout.heldout_prompts, layout.prompt_settings
    settings = {name: getattr(recipe, name) for name in PROMPT_FIELDS} | {"num_prompts": recipe.num_prompts}
    if data_path is not None:
        settings["data"] = Path(data_path).name
    if not train_file.exists():
        if data_path is None:
            raise SpecError(f"{work_dir}: holds no {train_file.name}; pass --data with a ShareGPT-style JSON file")
        with locked(layout.data_lock, f"--work-dir {work_dir}"):
            train, heldout = chat_prompt_split(
                tokenizer,
                data_path,
                recipe.max_prompt_tokens,
                recipe.num_prompts,
                recipe.heldout_prompts,
                turns=recipe.prompt_turns,
                context=recipe.prompt_context,
                offset=recipe.prompt_offset,
            )
            if recipe.target_prompts:
                if target_writer is None:
                    raise SpecError("--target-prompts needs the target to write them (no writer was given)")
                written = target_written_prompts(
                    tokenizer,
                    target_writer(),
                    recipe.target_prompts,
                    seed=recipe.replies.seed,
                    max_prompt_tokens=recipe.max_prompt_tokens,
                    batch=recipe.reply_batch_size,
                )
                print(f"prompts: the target wrote {len(written)} of {recipe.target_prompts} asked", flush=True)
                train = length_bucketed(train + written)
            write_prompts(heldout_file, heldout)
            settings_file.write_text(json.dumps(settings) + "\n")
            write_prompts(train_file, train)
    entries = read_prompts(train_file)
    from_data = [not is_target_written(entry) for entry in entries]
    if settings_file.is_file():  # work dirs prepared before the settings were recorded have none
        _check_prompt_settings(
            work_dir, read_json_object(settings_file, f"delete {work_dir} to start over"), settings, sum(from_data)
        )
    # the first num_prompts of the data set's (fewer than prepared is fine) and every prompt the target wrote
    kept = [index for index, data in enumerate(from_data) if data][: recipe.num_prompts]
    kept += [index for index, data in enumerate(from_data) if not data]
    return [entries[index]["ids"] for index in sorted(kept)]


def _check_prompt_settings(work_dir: Path, saved: dict, asked: dict, prepared: int) -> None:
    keys = [name for name in asked if name != "num_prompts" and name in saved]
    changed = changed_settings(saved, asked, keys, words=("prepared", "asked"), flags=True)
    if asked["num_prompts"] > prepared and prepared >= saved.get("num_prompts", prepared):
        changed.append(f"num-prompts: prepared {prepared}, asked {asked['num_prompts']}")
    if changed:
        raise SpecError(
            f"--work-dir {work_dir}: its prompts were prepared with other settings ({'; '.join(changed)}); "
            "use a new --work-dir for these, or ask for the prepared ones (fewer --num-prompts is fine)"
        )


def build_config(target: TargetModel, tokenizer, recipe: RecipeConfig, model_id: str) -> DrafterConfig:
    layer_ids = recipe.target_layer_ids or dflash_target_layer_ids(
        target.config.num_hidden_layers, recipe.num_hidden_layers
    )
    rows = target.vocab_size
    mask = recipe.mask_token_id if recipe.mask_token_id is not None else mask_token_for(tokenizer, rows)
    draft_vocab = recipe.draft_vocab_size
    if draft_vocab is not None and draft_vocab >= rows:  # the default (8192) on a small vocabulary: score it all
        draft_vocab = None
    return drafter_config_for(
        target,
        kind=recipe.kind,
        block_size=recipe.block_size,
        num_hidden_layers=recipe.num_hidden_layers,
        target_layer_ids=layer_ids,
        mask_token_id=mask,
        intermediate_size=recipe.intermediate_size,
        draft_vocab_size=draft_vocab,
        model_id=model_id,
    )


TRAINING_BYTES_PER_PARAMETER = 16  # fp32 weights, gradients and AdamW's two moments


def check_trainable_size(config: DrafterConfig, device: torch.device) -> None:
    """The drafter's weights, gradients and optimizer state fit the device (counted on the meta device, before
    anything is allocated), else one line naming the flags that size it."""
    with torch.device("meta"):
        parameters = sum(p.numel() for p in Drafter(config).parameters())
    needed, memory = parameters * TRAINING_BYTES_PER_PARAMETER, device_memory(device)
    if needed > memory:
        raise SpecError(
            f"the drafter has {parameters:,} parameters (--num-layers {config.num_hidden_layers}, "
            f"--intermediate-size {config.intermediate_size}): training needs {needed / 2**30:,.0f} GiB for its "
            f"weights, gradients and optimizer, more than {device}'s {memory / 2**30:,.0f} GiB; lower them"
        )


STAGES = ("prompts", "replies", "features", "train")


def run_recipe(
    target: TargetModel,
    tokenizer,
    target_dir: Path,
    data_path: Path | None,
    work_dir: Path,
    out_dir: Path,
    recipe: RecipeConfig,
    train: TrainConfig,
    model_id: str,
    progress: bool = True,
    until: str = "train",
    force: bool = False,
    evaluation: EvalConfig | None = None,
    ranks: Ranks = SINGLE,
    target_sharded: bool = False,
) -> Path | None:
    """Every stage in order up to `until`; a rerun with the same work_dir skips what is done and resumes training.
    The checkpoint belongs to work_dir: a rerun replaces it, anything else at out_dir needs `force`. With held-out
    prompts and `evaluation`, held-out acceptance is logged while training and the best drafter is the one written.
    With several ranks, rank 0 prepares the prompts and holds the locks, replies and features are made in shares,
    and every rank waits for each stage to be complete before the next; a target sharded over the ranks
    (`target_sharded`) writes no replies and computes features in lockstep."""
    evaluation = evaluation or EvalConfig()
    config = build_config(target, tokenizer, recipe, model_id)  # the drafter's flags refused before any stage runs
    check_trainable_size(config, target.device)
    if ranks.main:  # rank 0 prepares them; the others read them once they are written
        work_dir.mkdir(parents=True, exist_ok=True)

        def target_writer() -> Writer:
            kind = pick_generator(recipe.generator)
            length = 4 * recipe.max_prompt_tokens  # the template's header plus a whole prompt, with room to spare
            batch = recipe.reply_batch_size
            device, dtype = str(target.device), target.model.dtype
            return reply_writer(target_dir, kind, device, dtype, length, batch, recipe.replies.cache)

        prompts = prepare_prompts(tokenizer, data_path, work_dir, recipe, target_writer)
    distributed.barrier(ranks)
    if not ranks.main:
        prompts = prepare_prompts(tokenizer, data_path, work_dir, recipe)
    if until == "prompts":
        return None
    data_lock_held = lambda: locked(WorkDir(work_dir).data_lock, f"--work-dir {work_dir}")  # noqa: E731 - only for work to do
    lock = data_lock_held if ranks.main else nullcontext
    options = {"lock": lock, "ranks": ranks, "may_generate": not target_sharded}
    data_dir = _replies(
        target, target_dir, prompts, WorkDir(work_dir).replies, recipe, replies=recipe.replies, **options
    )
    heldout_dir = _heldout_replies(target, target_dir, work_dir, recipe, **options)
    distributed.barrier(ranks)
    if until == "replies":
        return None
    mode, reason = distributed.from_main(ranks, choose_features(recipe.features, target, config, data_dir, work_dir))
    if ranks.main:
        print(f"features: {mode} ({reason})", flush=True)
    for directory in (data_dir, heldout_dir) if mode == "cached" else (heldout_dir,):
        if directory is not None:
            cache_features(
                target, directory, config.target_layer_ids, recipe.feature_batch_size, lock, ranks, target_sharded
            )
    distributed.barrier(ranks)
    if until == "features":
        return None
    if mode == "cached":
        dataset = FeatureDataset.load(data_dir, config.target_layer_ids, target.fingerprint).to(target.device)
    else:
        dataset = FeatureDataset(load_sequences(data_dir), None).to(target.device)
    vocab = None
    if config.draft_vocab_size is not None:
        vocab = frequent_tokens(data_dir, config.draft_vocab_size, [tokenizer.eos_token_id])
    usable = dataset.trainable(config.block_size, train.seq_len)
    if not usable:
        raise SpecError(
            f"{data_dir}: no reply is longer than block_size={config.block_size}; "
            "raise max_new_tokens or lower block_size"
        )
    online = mode == "online"
    draw = ReplyBatches(
        dataset,
        usable,
        train.batch_size,
        config.block_size,
        train.anchors_per_seq,
        train.seq_len,
        train.seed,
        target if online else None,
        config.target_layer_ids if online else None,
    )
    if ranks.main:
        micro = train.batch_size // (ranks.world * train.grad_accum)
        print(
            f"training on {len(usable)} sequences: global batch {train.batch_size} = {micro} rows x {ranks.world} "
            f"rank(s) x {train.grad_accum} accumulation; {train.steps} steps at most = "
            f"{draw.passes(train.steps):.1f} passes over the data",
            flush=True,
        )
    layout, name = WorkDir(work_dir), out_dir.name
    log_file = layout.loss_log(name)

    def log(step: int, loss: float, seconds: float) -> None:
        with open(log_file, "a") as handle:
            handle.write(json.dumps({"step": step, "loss": round(loss, 5), "seconds": round(seconds, 2)}) + "\n")

    tracker = None
    if heldout_dir is not None and evaluation.every is not None and ranks.main:
        evaluation.check_blocks(config.block_size)
        evaluate = HeldoutAcceptance.load(
            heldout_dir,
            config.target_layer_ids,
            target.fingerprint,
            target.device,
            evaluation.blocks,
            lambda: autocast_for(train.precision, target.device),
        )
        tracker = HeldoutTracker(
            evaluate,
            evaluation.every,
            layout.heldout_log(name),
            layout.best(name),
            evaluation.plateau,
            recipe.heldout_eval_prompts,
        )
    what = f"--work-dir {work_dir} (training {out_dir.name})"
    with locked(layout.training_lock(name), what) if ranks.main else nullcontext():
        train_loop(
            target,
            config,
            draw,
            train,
            out_dir,
            layout.state(name),
            progress,
            draft_vocab=vocab,
            log=log,
            out_owner=str(work_dir.resolve()),
            force=force,
            heldout=tracker,
            ranks=ranks,
        )
    return out_dir


def _heldout_replies(
    target: TargetModel, target_dir: Path, work_dir: Path, recipe: RecipeConfig, **options
) -> Path | None:
    """Greedy replies to the first heldout_eval_prompts held-out prompts, in work_dir/heldout (the acceptance
    measured while training needs the target's greedy output, whatever the training replies are)."""
    heldout_file = WorkDir(work_dir).heldout_prompts
    if not recipe.heldout_eval_prompts or not heldout_file.is_file():
        return None
    prompts = [p["ids"] for p in read_prompts(heldout_file)][: recipe.heldout_eval_prompts]
    if not prompts:  # said, not silent: the run then keeps its last drafter, not the best held out (issue 47)
        print(
            f"note: {heldout_file} holds no held-out prompt (the data set's conversations all fell in the training "
            "split): no held-out acceptance is measured and the last drafter is written; use a larger --data, "
            "or pass --heldout-eval-prompts 0 to say so"
        )
        return None
    return _replies(target, target_dir, prompts, WorkDir(work_dir).heldout_replies, recipe, **options)


def _replies(target: TargetModel, target_dir: Path, prompts, out_dir: Path, recipe, replies=None, **options) -> Path:
    """The target's replies to `prompts` in out_dir, with the recipe's generation settings (greedy unless `replies`);
    `options`: generate_replies' lock, ranks and may_generate."""
    return generate_replies(
        target_dir,
        prompts,
        out_dir,
        max_new_tokens=recipe.max_new_tokens,
        shard_size=recipe.reply_batch_size,
        generator=recipe.generator,
        device=str(target.device),
        dtype=target.model.dtype,
        replies=replies,
        **options,
    )
