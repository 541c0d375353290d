"""Export a drafter, bound to its target's embedding and LM head, as one ONNX graph (torch legacy exporter).

Graph contract (dynamic batch B and context length T, block size k fixed at the trained size):
  features [B, T, F] float32, context_positions [B, T] int64, context_valid [B, T] bool,
  block_ids [B, 1, k] int64, block_positions [B, 1, k] int64  ->  logits [B, 1, k, V] float32.
The graph is the reference `Drafter.context_kv` + `Drafter.block_logits`, traced; only nn.RMSNorm is swapped
for the same formula in primitive ops, because the legacy exporter has no symbolic for aten::rms_norm.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from portable_spec.core.drafter import Drafter
from portable_spec.core.outputs import check_output_dir, write_dir_atomically
from portable_spec.core.spec import DrafterConfig, SpecError, parse_config, read_config
from portable_spec.core.target import TargetModel

GRAPH_FILE = "drafter.onnx"
MANIFEST_FILE = "export.json"
CONFIG_FILE = "config.json"
ONNX_FORMAT_VERSION = 1
DEFAULT_OPSET = 17
SUPPORTED_OPSETS = range(14, 21)  # 14: first with Trilu; 20: the legacy exporter's newest
INPUT_NAMES = ("features", "context_positions", "context_valid", "block_ids", "block_positions")
INPUT_DTYPES = (torch.float32, torch.int64, torch.bool, torch.int64, torch.int64)  # the graph's, in that order
OUTPUT_NAME = "logits"
META_PREFIX = "portable_spec."
EXPORT_TOLERANCE = 1e-4  # max abs logits error, fp32, onnxruntime vs torch, checked on every export


@dataclass(frozen=True)
class GraphMetadata:
    """What the graph's metadata_props carry: enough to refuse the wrong target and rebuild the config."""

    format_version: int
    variant: str
    block_size: int
    target_fingerprint: str
    target_layer_ids: list[int]
    opset: int
    drafter_config: DrafterConfig

    def to_props(self) -> dict[str, str]:
        return {
            f"{META_PREFIX}format_version": str(self.format_version),
            f"{META_PREFIX}variant": self.variant,
            f"{META_PREFIX}block_size": str(self.block_size),
            f"{META_PREFIX}target_fingerprint": self.target_fingerprint,
            f"{META_PREFIX}target_layer_ids": json.dumps(self.target_layer_ids),
            f"{META_PREFIX}opset": str(self.opset),
            f"{META_PREFIX}drafter_config": json.dumps(self.drafter_config.model_dump(mode="json")),
        }

    @classmethod
    def from_props(cls, props: dict[str, str], source: str) -> "GraphMetadata":
        def get(key: str) -> str:
            try:
                return props[META_PREFIX + key]
            except KeyError:
                raise SpecError(
                    f"{source}: metadata_props has no {META_PREFIX}{key}; this graph was not written by "
                    "`portable-spec export onnx`: re-export it"
                ) from None

        version = int(get("format_version"))
        if version != ONNX_FORMAT_VERSION:
            raise SpecError(
                f"{source}: {META_PREFIX}format_version={version}, this portable-spec reads "
                f"{ONNX_FORMAT_VERSION}; re-export the graph with this version"
            )
        config = parse_config(json.loads(get("drafter_config")), f"{source} metadata drafter_config")
        meta = cls(
            version,
            get("variant"),
            int(get("block_size")),
            get("target_fingerprint"),
            json.loads(get("target_layer_ids")),
            int(get("opset")),
            config,
        )
        if (meta.variant, meta.block_size, meta.target_fingerprint, meta.target_layer_ids) != (
            config.kind,
            config.block_size,
            config.target.fingerprint,
            config.target_layer_ids,
        ):
            raise SpecError(f"{source}: metadata_props disagree with the embedded drafter_config; re-export it")
        return meta


class OnnxRMSNorm(nn.Module):
    """nn.RMSNorm's formula in ops every opset (and the TensorRT parser) has; shares the original weight."""

    def __init__(self, norm: nn.RMSNorm) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class BoundDrafter(nn.Module):
    """The drafter plus, unless it has its own, the target's embedding and LM head as registered submodules (graph
    initializers)."""

    def __init__(self, drafter: Drafter) -> None:
        super().__init__()
        # A fresh copy so swapping norms never touches the caller's drafter; the target modules are shared.
        self.drafter = Drafter(drafter.config)
        self.drafter.shared = drafter.shared
        self.drafter.load_state_dict(drafter.state_dict())
        self.drafter.eval()
        if not drafter.config.own_embeddings:
            self.embed_tokens = drafter.shared.embed_tokens
            self.lm_head = drafter.shared.lm_head
        _swap_rms_norms(self.drafter)
        self.requires_grad_(False)

    def forward(self, features, context_positions, context_valid, block_ids, block_positions):
        context = self.drafter.context_kv(features, context_positions)
        mask = context_valid[:, None, :].expand(-1, block_ids.shape[-1], -1)  # [B, k, T]
        return self.drafter.block_logits(block_ids, block_positions, context, mask, context_positions)  # [B,1,k,V]


def _swap_rms_norms(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.RMSNorm):
            setattr(module, name, OnnxRMSNorm(child))
        else:
            _swap_rms_norms(child)


def check_opset(opset: int) -> None:
    if opset not in SUPPORTED_OPSETS:
        raise SpecError(
            f"opset={opset} is not supported: use {SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1} "
            f"(default {DEFAULT_OPSET}; the TorchScript exporter stops at {SUPPORTED_OPSETS.stop - 1})"
        )


def check_block_size(requested: str | int | None, config: DrafterConfig) -> None:
    """The block size is baked into the graph (block mask, shift-mix); only the trained one is valid."""
    if requested is None:
        return
    if str(requested).strip().lower() in ("dynamic", "-1", "none"):
        raise SpecError(
            f"block_size={requested!r}: a dynamic block size cannot be exported, the block attention mask and "
            f"shift-mix are fixed at the trained size; omit --block-size (the checkpoint has {config.block_size})"
        )
    try:
        value = int(requested)
    except ValueError:
        raise SpecError(
            f"block_size={requested!r} is not an integer; omit --block-size (the checkpoint has {config.block_size})"
        ) from None
    if value != config.block_size:
        raise SpecError(
            f"block_size={requested} differs from the checkpoint's block_size={config.block_size}; the graph is "
            "fixed at the trained size: omit --block-size, or train a drafter with the block size you need"
        )


def graph_inputs(features, context_positions, context_valid, block_ids, block_positions) -> dict[str, torch.Tensor]:
    """The graph's inputs by name, in the dtypes it declares: what a runtime (onnxruntime, TensorRT) is fed."""
    inputs = (features, context_positions, context_valid, block_ids, block_positions)
    return {name: tensor.to(dtype) for name, tensor, dtype in zip(INPUT_NAMES, inputs, INPUT_DTYPES)}


def example_inputs(config: DrafterConfig, batch: int = 2, context: int = 5, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of the graph's shapes; context_valid has holes, as a decode cache does."""
    generator = torch.Generator().manual_seed(seed)
    k = config.block_size
    features = torch.randn(batch, context, config.feature_size, generator=generator)
    positions = torch.arange(context).expand(batch, -1).clone()
    valid = torch.rand(batch, context, generator=generator) > 0.25
    valid[:, 0] = True
    block_ids = torch.randint(0, config.vocab_size, (batch, 1, k), generator=generator)
    block_positions = (context + torch.arange(k)).expand(batch, 1, k).clone()
    return features, positions, valid, block_ids, block_positions


def export_bound_drafter(
    target: TargetModel,
    drafter: Drafter,
    out_dir: Path,
    opset: int = DEFAULT_OPSET,
    block_size: str | int | None = None,
    verify: bool = True,
    force: bool = False,
) -> Path:
    """Write out_dir/{drafter.onnx, config.json, export.json} atomically; nothing is left on any error."""
    check_opset(opset)
    check_block_size(block_size, drafter.config)
    bound = bind_for_export(target, drafter)
    return write_dir_atomically(
        Path(out_dir), lambda tmp: write_graph_files(tmp, bound, opset, verify), kind="onnx-export", force=force
    )


def bind_for_export(target: TargetModel, drafter: Drafter) -> BoundDrafter:
    """Checks that fail before any file is written: the kind, binding and dtype."""
    if drafter.behaviour.sequential_head:
        head = "candidate selector" if drafter.behaviour.candidate_selector else "Markov head"
        raise SpecError(
            f"variant={drafter.config.kind}: the ONNX graph returns block logits, and a {drafter.config.kind} "
            f"drafter's drafts come from its {head} after them, slot after slot, which the ONNX proposer does not "
            "run yet; run it with the reference backend (`portable-spec generate`)"
        )
    target.require_bound(drafter)
    if target.model.dtype != torch.float32 or drafter.fc.weight.dtype != torch.float32:
        raise SpecError(
            f"dtype={target.model.dtype}/{drafter.fc.weight.dtype}: the ONNX graph is exported in float32; load "
            "the target and drafter in float32 (TensorRT lowers precision at build time with --fp16/--bf16)"
        )
    return BoundDrafter(drafter).eval()


def write_graph_files(out: Path, bound: BoundDrafter, opset: int, verify: bool = True) -> dict:
    """Write drafter.onnx (+ metadata), config.json and export.json into an existing (temporary) dir."""
    import onnx  # lazy: the core never imports engines or exporters

    config = bound.drafter.config
    meta = GraphMetadata(
        ONNX_FORMAT_VERSION,
        config.kind,
        config.block_size,
        config.target.fingerprint,
        list(config.target_layer_ids),
        opset,
        config,
    )
    start = time.perf_counter()
    graph_path = out / GRAPH_FILE
    _trace_to_onnx(bound, example_inputs(config), graph_path, opset)
    model = onnx.load(str(graph_path), load_external_data=False)
    for key, value in meta.to_props().items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(graph_path))
    onnx.checker.check_model(str(graph_path))
    manifest = {
        "format_version": ONNX_FORMAT_VERSION,
        "opset": opset,
        "variant": config.kind,
        "block_size": config.block_size,
        "target_model_id": config.target.model_id,
        "target_fingerprint": config.target.fingerprint,
        "inputs": list(INPUT_NAMES),
        "output": OUTPUT_NAME,
        "export_seconds": round(time.perf_counter() - start, 3),
    }
    if verify:
        manifest["verified_max_abs_error"] = verify_graph(bound, graph_path)
        manifest["tolerance"] = EXPORT_TOLERANCE
    (out / CONFIG_FILE).write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _trace_to_onnx(bound: BoundDrafter, inputs: tuple[torch.Tensor, ...], path: Path, opset: int) -> None:
    dynamic = {name: {0: "batch", 1: "context"} for name in INPUT_NAMES[:3]}
    dynamic.update({name: {0: "batch"} for name in (*INPUT_NAMES[3:], OUTPUT_NAME)})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings on shape checks that are constant by construction
        torch.onnx.export(
            bound,
            inputs,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes=dynamic,
        )


def verify_graph(bound: BoundDrafter, graph_path: Path) -> float:
    """Run the graph on other shapes than the trace's and compare with torch; fail the export past tolerance."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph_path), session_options(), providers=["CPUExecutionProvider"])
    inputs = example_inputs(bound.drafter.config, batch=3, context=9, seed=1)
    (logits,) = session.run([OUTPUT_NAME], {n: t.numpy() for n, t in graph_inputs(*inputs).items()})
    with torch.no_grad():
        reference = bound(*inputs)
    logits = torch.from_numpy(logits)
    masked = torch.isinf(reference)  # outside a reduced draft vocabulary: -inf in both, or the graph is wrong
    same_mask = torch.equal(torch.isinf(logits), masked)
    error = float((logits - reference).abs()[~masked].max()) if same_mask else float("inf")
    if not error <= EXPORT_TOLERANCE:
        raise SpecError(
            f"exported graph differs from the torch drafter: max abs logits error {error:.3g} > {EXPORT_TOLERANCE}; "
            "report this with the drafter config (the graph was not written)"
        )
    return error


def session_options():
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(torch.get_num_threads(), 1)
    options.inter_op_num_threads = 1
    return options


def export_onnx(
    drafter_dir: Path,
    target_dir: Path,
    out_dir: Path,
    opset: int = DEFAULT_OPSET,
    block_size: str | int | None = None,
    verify: bool = True,
    force: bool = False,
) -> Path:
    """`portable-spec export onnx`: cheap checks first (opset, block size), then load, bind and export."""
    check_opset(opset)
    check_block_size(block_size, read_config(Path(drafter_dir)))
    check_output_dir(Path(out_dir), "onnx-export", inputs=(drafter_dir, target_dir), force=force)  # before loading
    target = TargetModel.load(target_dir)
    return export_bound_drafter(target, target.load_drafter(drafter_dir), out_dir, opset, block_size, verify, force)
