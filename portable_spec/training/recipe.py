"""The drafter training recipe for any HF causal LM: the stages in order, each resumable in one work directory
(training/__init__.py has the stage -> module -> files table). `portable-spec train` runs it; the shipped SmolLM2
drafters were made with it (portable_spec/assets/smollm2/recipe.json).

Every stage is a function of (target, run settings, work dir); here they only run in order, with the one barrier
between stages (several ranks) and `--until`.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from portable_spec.core.outputs import locked
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.training import parallel
from portable_spec.training.batches import ReplyBatches
from portable_spec.training.config import TrainRun, write_run_file
from portable_spec.training.draft_vocab import frequent_tokens
from portable_spec.training.drafter_shape import build_config, check_trainable_size
from portable_spec.training.features import FeatureDataset, cache_features, choose_features
from portable_spec.training.heldout import HeldoutAcceptance, HeldoutTracker
from portable_spec.training.loop import autocast_for, train_loop
from portable_spec.training.parallel import SINGLE, Ranks
from portable_spec.training.prompts import heldout_eval_prompts, prepare_prompts
from portable_spec.training.replies import generate_replies, load_sequences, pick_generator, reply_writer
from portable_spec.training.work_dir import WorkDir

STAGES = ("prompts", "replies", "features", "train")


@dataclass(frozen=True)
class Recipe:
    """One run of the recipe: the loaded target, the run's settings and where it writes."""

    target: TargetModel
    target_dir: Path
    run: TrainRun
    work_dir: Path
    out_dir: Path
    model_id: str
    ranks: Ranks = SINGLE
    target_sharded: bool = False  # the target's layers sharded over the ranks: no replies, features in lockstep

    @property
    def layout(self) -> WorkDir:
        return WorkDir(self.work_dir)

    def lock(self):
        """The data lock, held by rank 0 while a data stage has work to do (the other ranks take none)."""
        if not self.ranks.main:
            return nullcontext()
        return locked(self.layout.data_lock, f"--work-dir {self.work_dir}")


def run_recipe(recipe: Recipe, progress: bool = True, until: str = "train", force: bool = False) -> Path | None:
    """Every stage in order up to `until`; a rerun with the same work dir skips what is done and resumes training.
    The checkpoint belongs to the work dir: a rerun replaces it, anything else at out_dir needs `force`. With
    held-out prompts and evaluation on, held-out acceptance is logged while training and the best drafter is the
    one written. With several ranks, rank 0 prepares the prompts and holds the locks, replies and features are made
    in shares, and every rank waits for each stage to be complete before the next."""
    config = build_config(recipe.target, recipe.target.tokenizer, recipe.run.drafter, recipe.model_id)
    check_trainable_size(config, recipe.target.device)  # the drafter's flags refused before any stage runs
    stages = {
        "prompts": prompts_stage,
        "replies": replies_stage,
        "features": partial(features_stage, config=config),
        "train": partial(train_stage, config=config, progress=progress, force=force),
    }
    data = None
    for name in STAGES:
        data = stages[name](recipe, data)
        parallel.barrier(recipe.ranks)  # every rank waits for the stage to be complete
        if name == until:
            break
    return data if until == "train" else None


def prompts_stage(recipe: Recipe, _=None) -> list[list[int]]:
    """Train prompts (rank 0 prepares them and writes the run file; the others read them once written)."""
    run, tokenizer = recipe.run, recipe.target.tokenizer
    if not recipe.ranks.main:
        parallel.barrier(recipe.ranks)
        return prepare_prompts(tokenizer, run.data, recipe.work_dir, run.prompts)
    recipe.work_dir.mkdir(parents=True, exist_ok=True)
    write_run_file(recipe.layout.run_config(recipe.out_dir.name), run)

    def target_writer():
        kind = pick_generator(run.replies.generator)
        length = 4 * run.prompts.max_prompt_tokens  # the template's header plus a whole prompt, with room to spare
        device, dtype = str(recipe.target.device), recipe.target.model.dtype
        batch = run.replies.reply_batch_size
        return reply_writer(recipe.target_dir, kind, device, dtype, length, batch, run.replies.reply_cache)

    prompts = prepare_prompts(
        tokenizer,
        run.data,
        recipe.work_dir,
        run.prompts,
        target_writer,
        seed=run.replies.reply_seed,
        batch=run.replies.reply_batch_size,
    )
    parallel.barrier(recipe.ranks)
    return prompts


def replies_stage(recipe: Recipe, prompts: list[list[int]]) -> tuple[Path, Path | None]:
    """The target's replies to the train prompts, and its greedy replies to the held-out evaluation prompts."""
    options = {
        "device": str(recipe.target.device),
        "dtype": recipe.target.model.dtype,
        "lock": recipe.lock,
        "ranks": recipe.ranks,
        "may_generate": not recipe.target_sharded,
    }
    replies = recipe.run.replies
    data_dir = generate_replies(recipe.target_dir, prompts, recipe.layout.replies, replies, **options)
    heldout = heldout_eval_prompts(recipe.work_dir, recipe.run.eval.heldout_eval_prompts)
    heldout_dir = None
    if heldout:
        greedy = replies.model_copy(update={"replies_per_prompt": 1})
        heldout_dir = generate_replies(recipe.target_dir, heldout, recipe.layout.heldout_replies, greedy, **options)
    return data_dir, heldout_dir


def features_stage(
    recipe: Recipe, data: tuple[Path, Path | None], config: DrafterConfig
) -> tuple[Path, Path | None, str]:
    """Target features cached for the replies (when they fit: features.choose_features) and for the held-out
    replies (always), or left to the training step (online)."""
    data_dir, heldout_dir = data
    target, ranks = recipe.target, recipe.ranks
    mode, reason = parallel.from_main(
        ranks, choose_features(recipe.run.features.feature_mode, target, config, data_dir, recipe.work_dir)
    )
    if ranks.main:
        print(f"features: {mode} ({reason})", flush=True)
    batch = recipe.run.features.feature_batch_size
    for directory in (data_dir, heldout_dir) if mode == "cached" else (heldout_dir,):
        if directory is not None:
            layers = config.target_layer_ids
            cache_features(target, directory, layers, batch, recipe.lock, ranks, recipe.target_sharded)
    return data_dir, heldout_dir, mode


def train_stage(
    recipe: Recipe, data: tuple[Path, Path | None, str], config: DrafterConfig, progress: bool, force: bool
) -> Path:
    """The draft vocabulary, the batches and the training loop; the checkpoint is written to out_dir."""
    data_dir, heldout_dir, mode = data
    target, ranks, train, name = recipe.target, recipe.ranks, recipe.run.train, recipe.out_dir.name
    if mode == "cached":
        dataset = FeatureDataset.load(data_dir, config.target_layer_ids, target.fingerprint).to(target.device)
    else:
        dataset = FeatureDataset(load_sequences(data_dir), None).to(target.device)
    vocab = None
    if config.draft_vocab_size is not None:
        vocab = frequent_tokens(data_dir, config.draft_vocab_size, [target.tokenizer.eos_token_id])
    usable = dataset.trainable(config.label_span, train.seq_len)
    if not usable:
        raise SpecError(
            f"{data_dir}: no reply is longer than {config.label_span} tokens (block_size={config.block_size}"
            f"{' and the token after it' if config.label_span > config.block_size else ''}); "
            "raise --max-new-tokens or lower --block-size"
        )
    online = mode == "online"
    draw = ReplyBatches(
        dataset,
        usable,
        train.batch_size,
        config.label_span,
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
    log_file = recipe.layout.loss_log(name)

    def log(step: int, loss: float, seconds: float) -> None:
        with open(log_file, "a") as handle:
            handle.write(json.dumps({"step": step, "loss": round(loss, 5), "seconds": round(seconds, 2)}) + "\n")

    tracker = _heldout_tracker(recipe, config, heldout_dir) if ranks.main else None
    what = f"--work-dir {recipe.work_dir} (training {name})"
    with locked(recipe.layout.training_lock(name), what) if ranks.main else nullcontext():
        train_loop(
            target,
            config,
            draw,
            train,
            recipe.out_dir,
            recipe.layout.state(name),
            progress,
            draft_vocab=vocab,
            log=log,
            out_owner=str(recipe.work_dir.resolve()),
            force=force,
            heldout=tracker,
            ranks=ranks,
        )
    return recipe.out_dir


def _heldout_tracker(recipe: Recipe, config: DrafterConfig, heldout_dir: Path | None) -> HeldoutTracker | None:
    evaluation, target, name = recipe.run.eval, recipe.target, recipe.out_dir.name
    if heldout_dir is None or not evaluation.active:
        return None
    evaluation.check_blocks(config.block_size)
    evaluate = HeldoutAcceptance.load(
        heldout_dir,
        config.target_layer_ids,
        target.fingerprint,
        target.device,
        evaluation.eval_blocks,
        lambda: autocast_for(recipe.run.train.precision, target.device),
    )
    return HeldoutTracker(
        evaluate,
        evaluation.eval_every,
        recipe.layout.heldout_log(name),
        recipe.layout.best(name),
        evaluation.plateau_evals,
        evaluation.heldout_eval_prompts,
    )
