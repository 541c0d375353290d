"""Export a drafter, bound to its target's embedding and LM head, as one ONNX graph (torch legacy exporter).

Graph contract (dynamic batch B and context length T, block size k fixed at the trained size):
  features [B, T, F] float32, context_positions [B, T] int64, context_valid [B, T] bool,
  block_ids [B, 1, k] int64, block_positions [B, 1, k] int64  ->  logits [B, 1, k, V] float32.
The graph is the reference `Drafter.context_kv` + `Drafter.block_logits`, traced; only nn.RMSNorm is swapped
for the same formula in primitive ops, because the legacy exporter has no symbolic for aten::rms_norm.

A drafter that picks its drafts slot after slot (dflash2's selector, dspark's Markov head, domino's GRU:
core/head_step.py) gets a second output and a second graph, the head's slot step, which the proposer runs in
head_step.chain_drafts as the reference does (greedy, or drawn by portable-spec's sampler at T > 0):
  drafter.onnx   ... -> logits [B, 1, k, V], hidden [B, 1, k, H] (the block's final states)
  head_step.onnx hidden [B, H], logits [B, V], previous [B] int64, state [B, S]
                 -> scores [B, V], next_state [B, S] (+ acceptance [B]: a dspark's confidence head)
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
HIDDEN_OUTPUT = "hidden"  # a sequential head's block graph only
STEP_FILE = "head_step.onnx"
STEP_INPUTS = ("hidden", "logits", "previous", "state")
STEP_OUTPUTS = ("scores", "next_state", "acceptance")  # acceptance: only where the head predicts it
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
        hidden = self.drafter.block_hidden(block_ids, block_positions, context, mask, context_positions)
        logits = self.drafter.to_full_vocab(self.drafter.scored_logits(hidden))  # [B, 1, k, V]
        return (logits, hidden) if self.drafter.behaviour.sequential_head else logits

    def output_names(self) -> list[str]:
        return [OUTPUT_NAME, HIDDEN_OUTPUT] if self.drafter.behaviour.sequential_head else [OUTPUT_NAME]


class BoundHeadStep(nn.Module):
    """A bound drafter's sequential head as one slot's step (core/head_step.py), the graph head_step.onnx holds."""

    def __init__(self, bound: BoundDrafter) -> None:
        super().__init__()
        self.config = bound.drafter.config
        self.step = bound.drafter.head_step()
        self.has_acceptance = bool(getattr(self.step, "confidence", None) is not None)

    def forward(self, hidden, logits, previous, state):
        scores, next_state, acceptance = self.step(hidden, logits, previous, state)
        return (scores, next_state, acceptance) if self.has_acceptance else (scores, next_state)

    def output_names(self) -> list[str]:
        return list(STEP_OUTPUTS[: 3 if self.has_acceptance else 2])

    def example_inputs(self, batch: int = 2, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Inputs of the step's shapes: a random slot state, block logits and recurrent state, a previous token."""
        generator = torch.Generator().manual_seed(seed)
        hidden = torch.randn(batch, self.config.hidden_size, generator=generator)
        logits = torch.randn(batch, self.config.vocab_size, generator=generator)
        previous = torch.randint(0, self.config.vocab_size, (batch,), generator=generator)
        state = torch.randn(batch, self.step.slots.state_size, generator=generator)
        return hidden, logits, previous, state


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
    """Checks that fail before any file is written: binding and dtype."""
    target.require_bound(drafter)
    if target.model.dtype != torch.float32 or drafter.fc.weight.dtype != torch.float32:
        raise SpecError(
            f"dtype={target.model.dtype}/{drafter.fc.weight.dtype}: the ONNX graph is exported in float32; load "
            "the target and drafter in float32 (TensorRT lowers precision at build time with --fp16/--bf16)"
        )
    return BoundDrafter(drafter).eval()


def write_graph_files(out: Path, bound: BoundDrafter, opset: int, verify: bool = True) -> dict:
    """Write drafter.onnx (+ head_step.onnx for a sequential head), each with the metadata, config.json and
    export.json into an existing (temporary) dir."""
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
    block_axes = {name: {0: "batch", 1: "context"} for name in INPUT_NAMES[:3]}
    block_axes.update({name: {0: "batch"} for name in (*INPUT_NAMES[3:], *bound.output_names())})
    graphs = [(GRAPH_FILE, bound, example_inputs(config), list(INPUT_NAMES), block_axes)]
    if bound.drafter.behaviour.sequential_head:
        step = BoundHeadStep(bound).eval()
        step_axes = {name: {0: "batch"} for name in (*STEP_INPUTS, *step.output_names())}
        graphs.append((STEP_FILE, step, step.example_inputs(), list(STEP_INPUTS), step_axes))
    for name, module, inputs, input_names, axes in graphs:
        _trace_to_onnx(module, inputs, out / name, opset, input_names, axes, meta)
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
    if len(graphs) > 1:
        manifest["outputs"] = bound.output_names()
        manifest["head_step"] = {"file": STEP_FILE, "inputs": list(STEP_INPUTS), "outputs": step.output_names()}
    if verify:
        inputs = example_inputs(config, batch=3, context=9, seed=1)
        manifest["verified_max_abs_error"] = verify_graph(out / GRAPH_FILE, bound, inputs, INPUT_NAMES)
        manifest["tolerance"] = EXPORT_TOLERANCE
        if len(graphs) > 1:
            inputs = step.example_inputs(batch=3, seed=1)
            error = verify_graph(out / STEP_FILE, step, inputs, STEP_INPUTS, relative=True)
            manifest["head_step"]["verified_max_relative_error"] = error
    (out / CONFIG_FILE).write_text(json.dumps(config.model_dump(mode="json"), indent=2) + "\n")
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _trace_to_onnx(
    module: nn.Module, inputs: tuple, path: Path, opset: int, input_names: list[str], axes: dict, meta: GraphMetadata
) -> None:
    """Trace `module` to `path` with dynamic `axes`, stamp the metadata on it and check it."""
    import onnx  # lazy: the core never imports engines or exporters

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings on shape checks that are constant by construction
        torch.onnx.export(
            module,
            inputs,
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=input_names,
            output_names=module.output_names(),
            dynamic_axes=axes,
        )
    model = onnx.load(str(path), load_external_data=False)
    for key, value in meta.to_props().items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))


def verify_graph(graph_path: Path, module: nn.Module, inputs: tuple, input_names, relative: bool = False) -> float:
    """Run the graph on other shapes than the trace's and compare every output with torch; fail the export past
    tolerance. -inf (outside a draft vocabulary, or a selector's candidates) must sit at the same places. With
    `relative`, each output's error is divided by its largest magnitude when that exceeds 1 (a selector's scores
    add codebook products of any size: float32 rounds them relative to their size)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph_path), session_options(), providers=["CPUExecutionProvider"])
    feeds = {name: tensor.numpy() for name, tensor in zip(input_names, inputs)}  # example inputs: the graph's dtypes
    outputs = session.run(module.output_names(), feeds)
    with torch.no_grad():
        reference = module(*inputs)
    reference = reference if isinstance(reference, tuple) else (reference,)
    error = 0.0
    for actual, expected in zip(outputs, reference):
        actual = torch.from_numpy(actual)
        masked = torch.isinf(expected)
        same_mask = torch.equal(torch.isinf(actual), masked)
        if not same_mask:
            error = float("inf")
        elif (~masked).any():
            scale = max(1.0, float(expected[~masked].abs().max())) if relative else 1.0
            error = max(error, float((actual - expected).abs()[~masked].max()) / scale)
    if not error <= EXPORT_TOLERANCE:
        raise SpecError(
            f"exported graph {graph_path.name} differs from the torch drafter: max abs error {error:.3g} > "
            f"{EXPORT_TOLERANCE}; report this with the drafter config (the graph was not written)"
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
