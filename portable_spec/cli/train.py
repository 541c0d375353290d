"""portable-spec train: the whole recipe for a drafter of your own HF model (see docs/training.md).

portable-spec train --target smollm2 --kind depth_causal --out drafters/dc --work-dir runs/smollm2
portable-spec train --target /models/Qwen3-8B --data sharegpt.json --device cuda --dtype bfloat16 ...
torchrun --nproc-per-node 8 -m portable_spec.cli train --target /models/Qwen3-8B --device cuda ...
"""

from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from portable_spec.cli.devices import DTYPES, check_device
from portable_spec.core.outputs import (
    check_not_an_input,
    check_output_dir,
    check_unlocked,
    claim_work_dir,
)
from portable_spec.core.real_target import KNOWN_TARGETS
from portable_spec.core.spec import SpecError
from portable_spec.training import parallel
from portable_spec.training.config import DrafterShape, PromptConfig, ReplyConfig, TrainRun, read_run_file
from portable_spec.training.heldout import check_resumed_evaluation
from portable_spec.training.loop import check_shapes
from portable_spec.training.parallel import check_layouts, shard_target
from portable_spec.training.recipe import STAGES, Recipe, run_recipe
from portable_spec.training.replies import pick_generator
from portable_spec.training.work_dir import WorkDir, changed_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="A run file (JSON, as each run writes to <work-dir>/<name>-run.json, e.g. "
        "portable_spec/assets/smollm2/recipe.json): its settings, the flags given override them.",
    )
    parser.add_argument("--out", type=Path, required=True, help="Checkpoint directory to write.")
    parser.add_argument(
        "--work-dir",
        type=Path,
        required=True,
        help="Prompts, replies, cached features and training state; reruns resume from it.",
    )
    parser.add_argument(
        "--until",
        choices=STAGES,
        default="train",
        help="Stop after this stage (e.g. prepare data once, then train several kinds on it).",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="Use a --work-dir or replace an --out that portable-spec did not write for this work dir "
        "(never an input).",
    )
    sections = {None: TrainRun, **TrainRun.sections()}
    for section, model in sections.items():
        title = model.__doc__.split("\n")[0].rstrip(".")
        group = parser.add_argument_group(f"{section}: {title}" if section else "run")
        for name, field in model.model_fields.items():
            if name in TrainRun.sections():
                continue
            group.add_argument(
                flag_of(name), dest=name, default=argparse.SUPPRESS, help=_help(field), **_argument_type(field)
            )


def flag_of(field: str) -> str:
    return "--" + field.replace("_", "-")


def flags_for(values: dict) -> list[str]:
    """The flags that set flat {field: value} (read_run's inverse, for scripts that start runs): None is left
    out (the default), a bool is --x / --no-x, a list its values."""
    argv: list[str] = []
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag_of(name) if value else "--no-" + flag_of(name)[2:])
        elif isinstance(value, (list, tuple)):
            argv += [flag_of(name), *map(str, value)]
        else:
            argv += [flag_of(name), str(value)]
    return argv


def _help(field: FieldInfo) -> str:
    """The field's description and its default, from the config model (the one place either is written)."""
    if field.is_required():
        return f"{field.description} (required)"
    default = field.get_default(call_default_factory=True)
    if isinstance(default, tuple):
        default = " ".join(map(str, default))
    return f"{field.description} (default: {default})"


def _argument_type(field: FieldInfo) -> dict:
    """argparse's type for a TrainRun field: Literal -> choices, bool -> --x / --no-x, list or tuple -> nargs,
    `X | None` -> X."""
    annotation = field.annotation
    options = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(options) == 1:
        annotation = options[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {"choices": typing.get_args(annotation)}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin in (list, tuple):
        return {"type": typing.get_args(annotation)[0], "nargs": "+"}
    return {"type": annotation}


def read_run(args: argparse.Namespace) -> TrainRun:
    """The run: --config's settings, then the flags given (argparse leaves the others out), validated as one
    TrainRun; an error names the flag as typed."""
    values = read_run_file(args.config, getattr(args, "kind", None)) if args.config is not None else {}
    flags = {name for model in (TrainRun, *TrainRun.sections().values()) for name in model.model_fields}
    values |= {name: getattr(args, name) for name in flags if hasattr(args, name)}
    return TrainRun.from_flat(values, label=_flag_label)


def _flag_label(item: dict) -> str:
    """A validation error's field named as the flag that sets it (core.errors.validation_line's label hook; a
    whole-config rule's message names its flags itself)."""
    fields = [part for part in item["loc"] if isinstance(part, str) and part not in TrainRun.sections()]
    if not fields:
        return ""
    value = item.get("input")
    shown = "" if isinstance(value, (dict, BaseModel)) or item["type"] == "missing" else f" {value!r}"
    return flag_of(fields[0]) + shown


def run(args: argparse.Namespace) -> int:
    from portable_spec.training.sharegpt import sharegpt_path

    run_ = read_run(args)
    ranks = parallel.from_environment()  # torchrun's; one process is world 1
    check_shapes(run_.drafter.block_size, run_.drafter.label_span, run_.train)  # before any model loads
    if run_.eval.active:
        run_.eval.check_blocks(run_.drafter.block_size)
    parallel.check_batch(ranks, run_.train.batch_size, run_.train.grad_accum)
    pick_generator(run_.replies.generator, ranks)
    check_layouts(ranks, run_.target_parallel, run_.features.feature_mode)
    if run_.train.init_from is not None:
        check_init_from(Path(run_.train.init_from), run_.drafter)
    device = parallel.rank_device(check_device(run_.device), ranks)
    data = run_.data
    if data is None and not WorkDir(args.work_dir).prompts_prepared():  # a prepared work dir needs no data set
        data = sharegpt_path()
    if data is not None and not Path(data).is_file():
        raise SpecError(f"--data {data}: not a file; pass a ShareGPT-style JSON file")
    run_ = run_.model_copy(update={"data": data})
    parallel.start(ranks, device)
    try:
        parallel.checked_by_main(ranks, lambda: _check_outputs(args, run_))
        return _train(args, run_, device, ranks)
    finally:
        parallel.finish()


def check_reply_length(target_dir: Path, replies: ReplyConfig, prompts: PromptConfig) -> None:
    """A prompt of --max-prompt-tokens plus a reply of --max-new-tokens must fit the target's positions (generate
    refuses the same overrun): past them the target's rotary tables end, and a reply stage sized by a huge
    --max-new-tokens would run for hours before anything is written."""
    from portable_spec.core.target_checks import check_target_dir

    limit = check_target_dir(Path(target_dir)).get("max_position_embeddings")
    if limit is not None and prompts.max_prompt_tokens + replies.max_new_tokens > limit:
        raise SpecError(
            f"--max-new-tokens {replies.max_new_tokens} with --max-prompt-tokens {prompts.max_prompt_tokens} reach "
            f"past the target's max_position_embeddings={limit}; use --max-new-tokens "
            f"{max(limit - prompts.max_prompt_tokens, 1)} or less"
        )


def check_dflash2_sizes(target_dir: Path, shape: DrafterShape) -> None:
    """A dflash2's sizes against the target's width and vocabulary (spec.dflash2_problem, the rule DrafterConfig
    applies), read from its config.json before the weights load, named as flags."""
    from portable_spec.core.spec import DFlash2Variant, dflash2_problem
    from portable_spec.core.target_checks import check_target_dir

    if shape.kind != DFlash2Variant.model_fields["kind"].default:
        return
    config = check_target_dir(Path(target_dir))

    def shown(field: str, value) -> str:
        return (
            f"the target's {field}={value}" if field in ("hidden_size", "vocab_size") else f"{flag_of(field)} {value}"
        )

    variant = DFlash2Variant(**shape.variant_options())
    # a config.json without these at the top (a nested text_config) leaves their rules to DrafterConfig, after loading
    hidden = config.get("hidden_size") or variant.conv_group_size
    vocab = config.get("vocab_size") or variant.selector_top_k
    problem = dflash2_problem(variant, hidden, vocab, shape.block_size, shown)
    if problem:
        raise SpecError(problem)


def _check_outputs(args: argparse.Namespace, run: TrainRun) -> None:
    """What the run writes is free to write (rank 0 checks for every rank: the others would see its locks)."""
    check_paths(args, run)
    claim_work_dir(args.work_dir, args.force)
    check_unlocked(WorkDir(args.work_dir).data_lock, f"--work-dir {args.work_dir}")  # fail at once, before loading
    check_unlocked(
        WorkDir(args.work_dir).training_lock(Path(args.out).name),
        f"--work-dir {args.work_dir} (training {Path(args.out).name})",
    )


def check_init_from(init_from: Path, shape: DrafterShape) -> None:
    """--init-from names a drafter checkpoint of the asked kind and block (read before any model loads; the rest of
    its shape is compared once the target is loaded, training.state.warm_start)."""
    from portable_spec.core.checkpoint import load_drafter_files

    saved, _ = load_drafter_files(init_from)  # its weights' dtypes and values (NaN, inf) too, before any model loads
    asked = ("kind", "block_size", "num_hidden_layers", "intermediate_size", "target_layer_ids", "mask_token_id")
    asked_fields = {field: getattr(shape, field) for field in asked if getattr(shape, field) is not None}
    changed = changed_settings({field: getattr(saved, field) for field in asked_fields}, asked_fields)
    if changed:
        raise SpecError(
            f"--init-from {init_from}: another drafter than this run asks for ({'; '.join(changed)}); train the "
            "saved shape or drop --init-from"
        )


def check_paths(args: argparse.Namespace, run: TrainRun) -> None:
    """Before any model loads: the checkpoint never replaces the work dir, an input, or what this work dir did
    not write (--force lifts only the last)."""
    out, work = Path(args.out).resolve(), Path(args.work_dir).resolve()
    if out == work or out in work.parents:
        raise SpecError(
            f"--out {args.out} {'is' if out == work else 'contains'} --work-dir {args.work_dir}: writing "
            "the checkpoint would replace the work dir (replies, features, training state); put the "
            f"checkpoint beside or inside the work dir, e.g. --out {args.work_dir}/drafters/{run.drafter.kind}"
        )
    init_from = Path(run.train.init_from) if run.train.init_from is not None else None
    target = None if run.target in KNOWN_TARGETS else Path(run.target)
    inputs = tuple(p for p in (run.data, target, init_from) if p is not None)
    check_not_an_input(Path(args.work_dir), inputs)  # --config may be the work dir's own run file (it is rewritten)
    config = (Path(args.config),) if args.config is not None else ()
    check_output_dir(Path(args.out), "drafter", inputs + config, force=args.force, owner=str(work))


def _train(args: argparse.Namespace, run: TrainRun, device, ranks: parallel.Ranks) -> int:
    from portable_spec.core.real_target import resolve_target, target_model_id
    from portable_spec.core.target import TargetModel

    if ranks.main:
        resolve_target(run.target)  # a known target is converted once, by rank 0
    parallel.barrier(ranks)
    target_dir = resolve_target(run.target)
    check_reply_length(target_dir, run.replies, run.prompts)  # before the weights load
    check_dflash2_sizes(target_dir, run.drafter)
    layout, name = WorkDir(args.work_dir), Path(args.out).name
    if run.eval.active:
        check_resumed_evaluation(
            layout.heldout_log(name), layout.state(name), run.eval.eval_blocks, run.eval.heldout_eval_prompts
        )
    if run.data is not None and not layout.prompts_prepared() and ranks.main:
        from portable_spec.training.sharegpt import human_turns

        human_turns(Path(run.data), run.prompts.prompt_turns, run.prompts.prompt_context)  # before the weights
    if run.prompts.target_prompts and not layout.prompts_prepared():  # its tokenizer alone, before the model loads
        from transformers import AutoTokenizer

        from portable_spec.training.target_prompts import user_turn_template

        user_turn_template(AutoTokenizer.from_pretrained(str(target_dir)))
    target = TargetModel.load(target_dir, dtype=DTYPES[run.dtype], tokenizer=True)
    if run.train.init_from is not None:  # bound to this target? before minutes of replies and features
        from portable_spec.core.spec import read_config

        target.check_drafter(read_config(Path(run.train.init_from)))
    shard_target(target, ranks, run.target_parallel)  # before the move: each rank's device takes its shards only
    target.model.to(device)
    model_id = KNOWN_TARGETS[run.target].model_id if run.target in KNOWN_TARGETS else target_model_id(target_dir)
    recipe = Recipe(
        target,
        target_dir,
        run,
        Path(args.work_dir),
        Path(args.out),
        model_id,
        ranks=ranks,
        target_sharded=run.target_parallel == "fsdp" and ranks.distributed,
    )
    out = run_recipe(recipe, until=args.until, force=args.force)
    if not ranks.main:
        return 0
    if out is None:
        print(f"stopped after stage {args.until!r}; {args.work_dir} holds the data")
        return 0
    print(
        f"wrote {out} ({run.drafter.kind}); loss curve: {layout.loss_log(out.name)}; settings: {layout.run_config(name)}"
    )
    return 0
