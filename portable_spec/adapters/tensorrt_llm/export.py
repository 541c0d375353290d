"""TensorRT-LLM export: what its build/load step consumes, per installed version and drafter variant.

Routes (one registry, ROUTES):
  dflash  TensorRT-LLM >= 1.3 (PyTorch backend, `DFlashDecodingConfig`): a z-lab-style DFlash HF checkpoint + the
          LLM-API `speculative_config`. `parallel` is DFlash's own drafter. `depth_causal` (causal block +
          shift-mix) runs in the same mode through plugin.py (TensorRT-LLM's draft-model builder registry,
          >= 1.4): the checkpoint adds `layers.{i}.shift_mix.weight`, and OUT gains the module directory that
          `trtllm-serve --custom_module_dirs` imports. `autoregressive` (one pass per token) cannot be expressed.
  onnx    any version, any variant: the bound drafter graph for the TensorRT builder (trtexec /
          tensorrt.OnnxParser) with optimization-profile shapes. No TensorRT-LLM LLM-API mode feeds
          target hidden states to an external drafter engine, so `speculative_config` is null and the
          engine is driven by portable-spec's loop (scripts/gpu/trtllm_check.py).
This module never imports tensorrt_llm: the version comes from package metadata or the caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors.torch import save_file

from portable_spec.adapters.onnx_export import (
    DEFAULT_OPSET,
    GRAPH_FILE,
    INPUT_NAMES,
    STEP_FILE,
    STEP_INPUTS,
    bind_for_export,
    check_block_size,
    check_opset,
    write_graph_files,
)
from portable_spec.adapters.shared_validate import refuse_reduced_vocabulary
from portable_spec.adapters.tensorrt_llm.depth_causal import SHIFT_MIX_WEIGHT
from portable_spec.core.drafter import Drafter
from portable_spec.core.head_step import chain_slots
from portable_spec.core.outputs import check_output_dir, write_dir_atomically
from portable_spec.core.spec import DrafterConfig, SpecError, read_config
from portable_spec.core.target import TargetModel
from portable_spec.core.variants import behaviour_of

MANIFEST_FILE = "trtllm.json"
DRAFT_DIR = "draft"  # the DFlash HF checkpoint inside the dflash route's output
LLM_API_OPTIONS_FILE = "extra_llm_api_options.yaml"  # for `trtllm-serve --extra_llm_api_options`
DFLASH_MIN_VERSION = (1, 3)
# The draft-model builder registry plugin.py needs; read on TensorRT-LLM's main branch (registry test at commit
# e27249f524b1211029b4f30346e7e0b7b57d2d1c), so a lower bound: plugin.register() checks for the registry itself.
IN_LOOP_MIN_VERSION = (1, 4)
MODULE_DIR = "portable_spec_trtllm"  # the package `trtllm-serve --custom_module_dirs` imports: it calls register()
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
# Drafter weights DFlash's loader knows (DFlashForCausalLM.load_weights); anything else cannot be expressed.
DFLASH_WEIGHT = re.compile(
    r"^(fc|hidden_norm|norm)\.weight$|^layers\.\d+\.(input_layernorm|post_attention_layernorm|"
    r"self_attn\.(q_proj|k_proj|v_proj|o_proj|q_norm|k_norm)|mlp\.(gate_proj|up_proj|down_proj))\.weight$"
)


class DFlashSpeculativeConfig(BaseModel):
    """Mirror of tensorrt_llm.llmapi.DFlashDecodingConfig (1.3.0rc27 docs) for the fields we set.

    Checked here without TensorRT-LLM; scripts/gpu/trtllm_check.py also builds the real class from it.
    """

    model_config = ConfigDict(extra="forbid")

    decoding_type: Literal["DFlash"] = "DFlash"
    max_draft_len: int = Field(ge=1, description="Draft tokens per step, <= block_size - 1.")
    speculative_model: str = Field(description="Directory of the DFlash HF checkpoint.")
    mask_token_id: int = Field(ge=0, description="Overrides dflash_config.mask_token_id (same value).")
    target_layer_ids: list[int] = Field(min_length=1, description="Output of target layer i (HF hidden_states[i+1]).")
    attention_backend: Literal["VANILLA", "TRTLLM"] = "VANILLA"


@dataclass(frozen=True)
class ExportRequest:
    """What the user asked for; validated before anything is loaded or written."""

    trtllm_version: str
    route: str = "auto"  # auto | dflash | onnx
    num_draft_tokens: int | None = None  # None = block_size - 1
    dtype: str = "bfloat16"  # dflash route: checkpoint dtype
    opset: int = DEFAULT_OPSET  # onnx route
    max_batch: int = 8  # onnx route: TensorRT optimization profile
    max_context: int = 4096


def parse_version(version: str) -> tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", version or "")
    if not match:
        raise SpecError(f"trtllm_version={version!r} is not a version; pass e.g. --trtllm-version 1.3.0rc27 or 1.2.1")
    return int(match[1]), int(match[2])


def installed_trtllm_version() -> str | None:
    """From package metadata, without importing tensorrt_llm (importing it needs CUDA)."""
    for name in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _dflash_unsupported(config: DrafterConfig, version: str) -> str | None:
    kind = config.kind
    if parse_version(version) < DFLASH_MIN_VERSION:
        return (
            f"TensorRT-LLM {version} has no DFlash mode (DFlashDecodingConfig arrived in 1.3; 1.2.x has only "
            "EAGLE3/MTP/draft-target/n-gram/user-provided, none feeds target hidden states to a block drafter)"
        )
    behaviour = behaviour_of(kind)
    if not behaviour.single_pass:
        return (
            f"variant={kind!r} drafts one token per pass; TensorRT-LLM's DFlash mode runs one pass per round, so "
            "only single-pass drafters (parallel, depth_causal) map onto DFlashDecodingConfig"
        )
    if not behaviour.dflash_shaped:
        return (
            f"variant={kind!r} has {behaviour.extras}; TensorRT-LLM's DFlash mode and portable-spec's draft-model "
            "builder run DFlash's layers and greedy head only"
        )
    if not behaviour.engine_native and parse_version(version) < IN_LOOP_MIN_VERSION:
        needed = ".".join(map(str, IN_LOOP_MIN_VERSION))
        return (
            f"variant={kind!r} runs in TensorRT-LLM's DFlash mode only through portable-spec's draft-model "
            f"builder (causal block + shift-mix), which needs TensorRT-LLM >= {needed} (the draft-model builder "
            f"registry); found {version}"
        )
    if behaviour.engine_native and any(config.layer_attention(i).block_causal for i in range(config.num_hidden_layers)):
        return (
            f"variant.block_attention={config.variant.block_attention}: TensorRT-LLM's DFlash drafter runs the block "
            "bidirectionally in every layer (modeling_dflash.py: generic DFlash keeps `_sliding_layers_causal` off)"
        )
    if config.has_windows and config.window_rule == "per_anchor":
        return (
            "window_rule=per_anchor: TensorRT-LLM's DFlash drafter windows each slot from its own position "
            "(use_swa / swa_window_size, q - k < W), not from the block's anchor as speculators' trainer does"
        )
    if config.own_embeddings:
        return (
            f"own_embeddings=true (hidden_size {config.hidden_size}, target {config.target.hidden_size}): TensorRT-LLM's "
            "DFlash drafter shares the target's embed_tokens and lm_head (modeling_dflash.py load_weights) and loads "
            "none of its own"
        )
    if not behaviour.engine_native and config.has_windows:
        return (
            f"layer_types={config.layer_types}: the depth_causal builder (plugin.py) is mirrored without sliding "
            "windows, so windowed depth_causal drafters are not exported to TensorRT-LLM's DFlash mode"
        )
    return None


def _onnx_unsupported(config: DrafterConfig, version: str) -> str | None:
    parse_version(version)
    return None


def resolve_route(config: DrafterConfig, request: ExportRequest) -> str:
    """auto = dflash when it can express the drafter; the ONNX route is only taken when asked for."""
    if request.route not in ("auto", *ROUTES):
        raise SpecError(f"route={request.route!r} is unknown; valid options: auto, {', '.join(ROUTES)}")
    name = "dflash" if request.route == "auto" else request.route
    reason = ROUTES[name].unsupported(config, request.trtllm_version)
    if reason:
        raise SpecError(
            f"route={name}: {reason}. Fix: export a parallel drafter (TensorRT-LLM >= 1.3) or a depth_causal one "
            "(>= 1.4), or pass --route onnx for a standalone TensorRT drafter engine driven by portable-spec "
            "(TensorRT-LLM's LLM API cannot use it)"
        )
    return name


# -- dflash route -------------------------------------------------------------------------------------
def dflash_weights(drafter: Drafter, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Drafter-owned weights under DFlash names (ours already match), plus depth_causal's shift-mix weights, which
    plugin.py's mixin takes before TensorRT-LLM's loader sees the rest; anything else cannot be expressed."""
    refuse_reduced_vocabulary(drafter.config, "drafter", "TensorRT-LLM")
    shift_mix = drafter.behaviour.shift_mix
    weights = {name: t.detach().to("cpu", dtype).contiguous() for name, t in drafter.state_dict().items()}
    foreign = sorted(
        name for name in weights if not DFLASH_WEIGHT.match(name) and not (shift_mix and SHIFT_MIX_WEIGHT.match(name))
    )
    if foreign:
        raise SpecError(
            f"variant={drafter.config.kind!r}: weights {foreign[:4]} have no place in a DFlash checkpoint; "
            "use --route onnx for this drafter"
        )
    return weights


def dflash_hf_config(target: TargetModel, drafter: Drafter, dtype: str) -> dict:
    """config.json TensorRT-LLM's DFlash loader reads; model_type qwen3 because our layers have q/k norms.

    max_position_embeddings is the target's: TensorRT-LLM sizes the drafter's RoPE table from it."""
    c, t = drafter.config, target.config
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": c.rope_parameters(),  # YaRN included: TensorRT-LLM's RotaryEmbedding reads HF's keys
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": int(t.max_position_embeddings),
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "use_sliding_window": c.has_windows,
        "sliding_window": c.sliding_window,
        "max_window_layers": c.num_hidden_layers,
        "layer_types": c.engine_layer_types(),
        "is_causal": c.block_causal,
        "block_size": c.block_size,
        "num_target_layers": c.target.num_hidden_layers,
        "dflash_config": {
            "mask_token_id": c.mask_token_id,
            "target_layer_ids": list(c.target_layer_ids),
            "block_size": c.block_size,
            "num_target_layers": c.target.num_hidden_layers,
            # TensorRT-LLM windows the layer_types' sliding layers only with these (modeling_dflash.py)
            **({"use_swa": True, "swa_window_size": c.sliding_window} if c.has_windows else {}),
        },
        "portable_spec": {
            "variant": c.kind,
            "format_version": c.format_version,
            "target_model_id": c.target.model_id,
            "target_fingerprint": c.target.fingerprint,
        },
    }


def dflash_speculative_config(drafter: Drafter, draft_dir: Path, num_draft_tokens: int) -> dict:
    spec = DFlashSpeculativeConfig(
        max_draft_len=num_draft_tokens,
        speculative_model=str(draft_dir),
        mask_token_id=drafter.config.mask_token_id,
        target_layer_ids=list(drafter.config.target_layer_ids),
    )
    return spec.model_dump()


def _write_dflash(
    tmp: Path, final: Path, target: TargetModel, drafter: Drafter, request: ExportRequest, num_drafts: int
) -> dict:
    weights = dflash_weights(drafter, DTYPES[request.dtype])
    (tmp / DRAFT_DIR).mkdir()
    (tmp / DRAFT_DIR / "config.json").write_text(json.dumps(dflash_hf_config(target, drafter, request.dtype), indent=2))
    save_file(weights, str(tmp / DRAFT_DIR / "model.safetensors"), metadata={"format": "pt"})
    spec = dflash_speculative_config(drafter, final.resolve() / DRAFT_DIR, num_drafts)
    lines = ["speculative_config:"] + [f"  {key}: {json.dumps(value)}" for key, value in spec.items()]
    (tmp / LLM_API_OPTIONS_FILE).write_text("\n".join(lines) + "\n")
    build = {
        "step": "none: the PyTorch backend loads the draft checkpoint at LLM(...) construction",
        "llm_api": "LLM(model=TARGET, speculative_config=DFlashDecodingConfig(**speculative_config))",
        "serve": f"trtllm-serve TARGET --extra_llm_api_options {LLM_API_OPTIONS_FILE}",
    }
    if not drafter.behaviour.engine_native:
        (tmp / MODULE_DIR).mkdir()
        (tmp / MODULE_DIR / "__init__.py").write_text(
            '"""Imported by `trtllm-serve --custom_module_dirs`: serve portable depth_causal drafters in DFlash mode."""\n'
            "from portable_spec.adapters.tensorrt_llm.plugin import register\n\nregister()\n"
        )
        module_dir = final.resolve() / MODULE_DIR
        build = {
            **build,
            "plugin": "portable_spec.adapters.tensorrt_llm.plugin (needs portable-spec installed next to TensorRT-LLM)",
            "llm_api": "from portable_spec.adapters.tensorrt_llm.plugin import register; register(); "
            + build["llm_api"],
            "serve": f"{build['serve']} --custom_module_dirs {module_dir}",
        }
    return {"speculative_config": spec, "build": build}


# -- onnx route ---------------------------------------------------------------------------------------
def trt_profile(drafter: Drafter, request: ExportRequest) -> dict[str, list[list[int]]]:
    """min/opt/max shapes per graph input for the TensorRT optimization profile."""
    k, f = drafter.config.block_size, drafter.config.feature_size
    shapes = {}
    for batch, context, label in (
        (1, 1, "min"),
        (1, min(512, request.max_context), "opt"),
        (request.max_batch, request.max_context, "max"),
    ):
        dims = ([batch, context, f], [batch, context], [batch, context], [batch, 1, k], [batch, 1, k])
        for name, dim in zip(INPUT_NAMES, dims):
            shapes.setdefault(name, []).append(dim)
    return shapes


def step_profile(drafter: Drafter, request: ExportRequest) -> dict[str, list[list[int]]]:
    """min/opt/max shapes of a sequential head's step graph (head_step.onnx): one slot of every request."""
    config, state = drafter.config, chain_slots(drafter.config).state_size
    shapes = {}
    for batch in (1, 1, request.max_batch):
        dims = ([batch, config.hidden_size], [batch, config.vocab_size], [batch], [batch, state])
        for name, dim in zip(STEP_INPUTS, dims):
            shapes.setdefault(name, []).append(dim)
    return shapes


def trtexec_command(graph: str, profile: dict[str, list[list[int]]]) -> str:
    flag = lambda i: ",".join(f"{n}:{'x'.join(map(str, s[i]))}" for n, s in profile.items())  # noqa: E731
    plan = graph.removesuffix(".onnx") + ".plan"
    return (
        f"trtexec --onnx={graph} --saveEngine={plan} --minShapes={flag(0)} --optShapes={flag(1)} --maxShapes={flag(2)}"
    )


def _write_onnx(
    tmp: Path, final: Path, target: TargetModel, drafter: Drafter, request: ExportRequest, num_drafts: int
) -> dict:
    manifest = write_graph_files(tmp, bind_for_export(target, drafter), request.opset)
    profile = trt_profile(drafter, request)
    build = {
        "step": "TensorRT builder on drafter.onnx (float32 graph; add --fp16/--bf16 to lower)",
        "trtexec": trtexec_command(GRAPH_FILE, profile),
        "profile": profile,
        "onnx": manifest,
    }
    if drafter.behaviour.sequential_head:  # the head's slot step: run slot after slot as head_step.chain_drafts does
        build["head_step_profile"] = step_profile(drafter, request)
        build["head_step_trtexec"] = trtexec_command(STEP_FILE, build["head_step_profile"])
    return {
        "speculative_config": None,
        "llm_api": "none: no TensorRT-LLM mode feeds target hidden states to an external drafter engine",
        "build": build,
    }


@dataclass(frozen=True)
class Route:
    unsupported: Callable[[str, str], str | None]
    write: Callable[..., dict]


ROUTES: dict[str, Route] = {
    "dflash": Route(_dflash_unsupported, _write_dflash),
    "onnx": Route(_onnx_unsupported, _write_onnx),
}


# -- entry points -------------------------------------------------------------------------------------
def check_request(config: DrafterConfig, request: ExportRequest) -> tuple[str, int]:
    """Every user-input check that needs no model: route, version, dtype, opset, block size, draft count."""
    route, block_size = resolve_route(config, request), config.block_size
    if request.dtype not in DTYPES:
        raise SpecError(f"dtype={request.dtype!r} is unknown; valid options: {', '.join(DTYPES)}")
    if route == "onnx":
        check_opset(request.opset)
    num_drafts = block_size - 1 if request.num_draft_tokens is None else request.num_draft_tokens
    if not 1 <= num_drafts <= block_size - 1:
        raise SpecError(f"num_draft_tokens={num_drafts} does not fit block_size={block_size}: use 1..{block_size - 1}")
    if request.max_batch < 1 or request.max_context < 1:
        raise SpecError(f"max_batch={request.max_batch}, max_context={request.max_context}: both must be >= 1")
    return route, num_drafts


def export_for_trtllm(
    target: TargetModel,
    drafter: Drafter,
    out_dir: Path,
    request: ExportRequest,
    block_size: str | int | None = None,
    force: bool = False,
) -> Path:
    """Write out_dir atomically: the route's files + trtllm.json (route, version, speculative_config, build)."""
    config = drafter.config
    check_block_size(block_size, config)
    route, num_drafts = check_request(config, request)
    target.require_bound(drafter)
    out_dir = Path(out_dir)

    def write(tmp: Path) -> None:
        details = ROUTES[route].write(tmp, out_dir, target, drafter, request, num_drafts)
        manifest = {
            "route": route,
            "tensorrt_llm_version": request.trtllm_version,
            "variant": config.kind,
            "block_size": config.block_size,
            "num_draft_tokens": num_drafts,
            "target_model_id": config.target.model_id,
            "target_fingerprint": config.target.fingerprint,
            "target_layer_ids": list(config.target_layer_ids),
            **details,
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")

    return write_dir_atomically(out_dir, write, kind="trtllm-export", force=force)


def export_trtllm(
    drafter_dir: Path,
    target_dir: Path,
    out_dir: Path,
    request: ExportRequest,
    block_size: str | int | None = None,
    force: bool = False,
) -> Path:
    """`portable-spec export trtllm`: checks that need only config.json first, then load and write."""
    config = read_config(Path(drafter_dir))
    check_block_size(block_size, config)
    check_request(config, request)
    check_output_dir(Path(out_dir), "trtllm-export", inputs=(drafter_dir, target_dir), force=force)  # before loading
    target = TargetModel.load(target_dir)
    return export_for_trtllm(target, target.load_drafter(drafter_dir), out_dir, request, block_size, force)


def validate_speculative_config(spec: dict) -> DFlashSpeculativeConfig:
    """Validate against the mirror (always) — the GPU script repeats this with TensorRT-LLM's own class."""
    try:
        return DFlashSpeculativeConfig.model_validate(spec)
    except ValidationError as error:
        raise SpecError(f"speculative_config is not a valid DFlashDecodingConfig: {error}") from None
