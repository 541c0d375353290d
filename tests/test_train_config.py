"""One run config (issue 46): every setting of `portable-spec train` is a TrainRun field, its flag generated from
it (name, help, default written once), and a run file round-trips."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from portable_spec.cli import train as train_cli
from portable_spec.core.spec import SpecError
from portable_spec.training.config import TrainRun, read_run_file, write_run_file

RECIPE = Path(train_cli.__file__).resolve().parents[1] / "assets" / "smollm2" / "recipe.json"
MODELS = (TrainRun, *TrainRun.sections().values())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="train")
    train_cli.add_arguments(parser)
    return parser


def _run(argv: list[str], tmp_path: Path) -> TrainRun:
    args = _parser().parse_args(["--out", str(tmp_path / "out"), "--work-dir", str(tmp_path / "work"), *argv])
    return train_cli.read_run(args)


def test_field_names_are_unique_flags_across_sections():
    names = [name for model in MODELS for name in model.model_fields if name not in TrainRun.sections()]
    assert len(names) == len(set(names))
    assert all(model.model_fields[name].description for model in MODELS for name in model.model_fields)


def test_help_lists_every_setting_once_with_the_models_default():
    text = _parser().format_help()
    for model in MODELS:
        for name, field in model.model_fields.items():
            if name in TrainRun.sections():
                continue
            flag = train_cli.flag_of(name)
            assert len(re.findall(rf"^  {flag}(?=[ ,\n])", text, re.M)) == 1, flag
            if not field.is_required() and not isinstance(field.get_default(), (tuple, type(None))):
                entry = text[re.search(rf"\n  {flag}(?=[ ,\n])", text).start() + 1 :].split("\n  --")[0]
                assert f"(default: {field.get_default()})" in " ".join(entry.split()), flag


def test_config_round_trips_and_flags_override_it(tmp_path):
    argv = ["--target", "fixture", "--kind", "depth_causal", "--block-size", "4", "--eval-blocks", "4",
            "--prompt-context", "--steps", "7", "--data", "chat.json", "--reply-seed", "3"]  # fmt: skip
    run = _run(argv, tmp_path)
    assert (run.drafter.block_size, run.eval.eval_blocks, run.prompts.prompt_context) == (4, (4,), True)
    write_run_file(tmp_path / "run.json", run)
    again = _run(["--config", str(tmp_path / "run.json")], tmp_path)
    assert again.model_copy(update={"data": run.data.resolve()}) == again and again.data == Path("chat.json").resolve()
    assert again.model_dump(exclude={"data"}) == run.model_dump(exclude={"data"})
    assert _run(train_cli.flags_for(run.flat()), tmp_path) == run  # the flags a script would pass: the same run
    changed = _run(["--config", str(tmp_path / "run.json"), "--steps", "9", "--no-prompt-context"], tmp_path)
    assert (changed.train.steps, changed.prompts.prompt_context) == (9, False)
    assert changed.model_dump(exclude={"train", "prompts"}) == again.model_dump(exclude={"train", "prompts"})


def test_errors_name_the_flag(tmp_path):
    with pytest.raises(SpecError, match=r"^--kind: Field required$"):
        _run(["--target", "fixture"], tmp_path)
    with pytest.raises(SpecError, match=r"^--block-size 1: Input should be greater than or equal to 2$"):
        _run(["--target", "fixture", "--kind", "parallel", "--block-size", "1"], tmp_path)
    (tmp_path / "bad.json").write_text(json.dumps({"target": "fixture", "drafter": {"kind": "parallel", "blocks": 4}}))
    with pytest.raises(SpecError, match=r"--blocks 4: Extra inputs are not permitted"):
        _run(["--config", str(tmp_path / "bad.json")], tmp_path)


def test_the_shipped_recipe_trains_each_of_its_kinds(tmp_path):
    for kind, width in (("depth_causal", 1536), ("parallel", 1920)):
        run = _run(["--config", str(RECIPE), "--kind", kind], tmp_path)
        assert (run.target, run.drafter.intermediate_size, run.drafter.target_layer_ids) == (
            "smollm2",
            width,
            [1, 14, 27],
        )
        assert Path(run.train.init_from) == RECIPE.parent / "drafters" / kind  # relative to the recipe file
    with pytest.raises(SpecError, match="this recipe trains depth_causal, parallel; pass --kind"):
        read_run_file(RECIPE, "autoregressive")
