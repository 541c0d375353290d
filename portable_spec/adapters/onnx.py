"""ONNX Runtime backend: the exported bound drafter graph drafts, the reference loop verifies.

The graph has no KV cache input, so the proposer's state is the raw context (features, positions) and each
round reruns the graph over it; the reference proposer caches K/V instead, which is the same math.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from portable_spec.adapters.onnx_export import (
    GRAPH_FILE,
    OUTPUT_NAME,
    GraphMetadata,
    export_bound_drafter,
    graph_inputs,
    session_options,
)
from portable_spec.core.backends import DecoderBackend, ReferenceBackend
from portable_spec.core.decode import SpeculativeDecoder
from portable_spec.core.drafter import greedy_drafts
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.core.variants import VARIANTS, behaviour_of


class OnnxDrafterGraph:
    """An exported drafter graph in onnxruntime; load refuses a graph bound to another target."""

    def __init__(self, graph_dir: Path, target: TargetModel) -> None:
        import onnxruntime as ort

        path = Path(graph_dir) / GRAPH_FILE if Path(graph_dir).is_dir() else Path(graph_dir)
        if not path.exists():
            raise SpecError(f"{path}: not found; create it with `portable-spec export onnx DRAFTER OUT --target T`")
        self.session = ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
        self.metadata = GraphMetadata.from_props(self.session.get_modelmeta().custom_metadata_map, str(path))
        self.config: DrafterConfig = self.metadata.drafter_config
        if self.metadata.target_fingerprint != target.fingerprint:
            raise SpecError(
                f"{path}: target_fingerprint={self.metadata.target_fingerprint[:19]}... but the served target "
                f"{target.model_id!r} has {target.fingerprint[:19]}...: this graph embeds another target's "
                "embedding/LM head; re-export it with `portable-spec export onnx DRAFTER OUT --target <this target>`"
            )
        target.check_drafter(self.config)

    def block_logits(self, features, context_positions, context_valid, block_ids, block_positions) -> torch.Tensor:
        """One pass, shapes as the graph contract (onnx_export.py); blocks shorter than k only if block-causal."""
        k, width = self.config.block_size, block_ids.shape[-1]
        if width != k:
            if width > k or not self.config.block_causal:
                raise SpecError(
                    f"block of {width} slots given, the graph's block_size is {k} ({self.config.kind}); "
                    f"pass blocks of exactly {k} slots"
                )
            # Causal blocks: slots < width never see the padding, so padding then slicing is exact.
            pad = block_ids.new_full((*block_ids.shape[:2], k - width), self.config.mask_token_id)
            block_ids = torch.cat((block_ids, pad), dim=-1)
            tail = block_positions[..., -1:] + torch.arange(1, k - width + 1, device=block_positions.device)
            block_positions = torch.cat((block_positions, tail), dim=-1)
        inputs = graph_inputs(features, context_positions, context_valid, block_ids, block_positions)
        feeds = {name: tensor.detach().cpu().numpy() for name, tensor in inputs.items()}
        (logits,) = self.session.run([OUTPUT_NAME], feeds)
        return torch.from_numpy(logits)[..., :width, :]  # [B, 1, width, V]


@dataclass
class OnnxContext:
    """Proposer state: every context slot so far, mirroring the target cache's slots."""

    features: torch.Tensor  # [B, S, F]
    positions: torch.Tensor  # [B, S]


class OnnxProposer:
    """DraftProposer over an OnnxDrafterGraph: greedy drafts from the graph's block logits."""

    def __init__(self, graph: OnnxDrafterGraph) -> None:
        self.graph = graph
        self.config = graph.config
        self.behaviour = behaviour_of(graph.config.kind)

    def begin(self, features, positions) -> OnnxContext:
        return OnnxContext(features, positions)

    def extend(self, state: OnnxContext, features, positions) -> OnnxContext:
        return OnnxContext(torch.cat((state.features, features), dim=1), torch.cat((state.positions, positions), dim=1))

    def crop(self, state: OnnxContext, length: int) -> OnnxContext:
        return OnnxContext(state.features[:, :length], state.positions[:, :length])

    def propose(self, state: OnnxContext, valid, anchor_tokens, anchor_positions, num_drafts) -> torch.Tensor:
        return self.propose_scored(state, valid, anchor_tokens, anchor_positions, num_drafts)[0]

    def propose_scored(self, state: OnnxContext, valid, anchor_tokens, anchor_positions, num_drafts):
        k = self.config.block_size  # the graph's block is fixed at export
        positions = anchor_positions.cpu()[:, None, None] + torch.arange(k)
        run = lambda ids: self.graph.block_logits(state.features, state.positions, valid, ids, positions)  # noqa: E731
        tokens, probability = greedy_drafts(run, self.config, anchor_tokens.cpu(), num_drafts, k)
        return tokens.to(anchor_tokens.device), probability.to(anchor_tokens.device)

    def passes_per_round(self, num_drafts: int) -> int:
        return num_drafts if self.behaviour.autoregressive else 1


class OnnxBackend(DecoderBackend):
    """Drafting in onnxruntime from the exported graph; `drafter_dir` is a graph dir or a checkpoint to export."""

    name = "onnx"
    # the graph returns block logits; a candidate selector's picks after them are not in it (onnx_export refuses)
    kinds_supported = tuple(kind for kind, behaviour in VARIANTS.items() if not behaviour.sequential_head)

    def __init__(self) -> None:
        self._graphs: dict[tuple[str, str], OnnxDrafterGraph] = {}
        self._exports: tempfile.TemporaryDirectory | None = None

    def version(self) -> str | None:
        from importlib import metadata

        try:
            return f"onnxruntime {metadata.version('onnxruntime')}"
        except metadata.PackageNotFoundError:
            return None

    def unavailable_reason(self) -> str | None:
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
        except ImportError as error:
            return f"onnx/onnxruntime not importable ({error}); install with `pip install portable-spec[onnx]`"
        return None

    # Only the drafter is exported: this backend's target IS the HF torch target, scored by the reference path.
    target_forward = ReferenceBackend.target_forward

    def graph(self, target: TargetModel, target_dir: Path, drafter_dir: Path) -> OnnxDrafterGraph:
        """The graph for drafter_dir: loaded if it is an export, else exported once (cached per instance)."""
        key = (str(target_dir), str(drafter_dir))
        if key not in self._graphs:
            graph_dir = Path(drafter_dir)
            if not (graph_dir / GRAPH_FILE).exists():
                if self._exports is None:
                    self._exports = tempfile.TemporaryDirectory(prefix="portable-spec-onnx-")
                graph_dir = Path(self._exports.name) / f"graph-{len(self._graphs)}"
                export_bound_drafter(target, target.load_drafter(drafter_dir), graph_dir)
            self._graphs[key] = OnnxDrafterGraph(graph_dir, target)
        return self._graphs[key]

    def block_logits(
        self, target_dir, drafter_dir, features, context_positions, context_valid, block_ids, block_positions
    ):
        graph = self.graph(TargetModel.load(target_dir), target_dir, drafter_dir)
        return graph.block_logits(features, context_positions, context_valid, block_ids, block_positions)

    def decoder(self, target_dir: Path, drafter_dir: Path | None) -> SpeculativeDecoder:
        """The reference loop drafting with the graph; drafter_dir None: the target decodes alone."""
        target = TargetModel.load(target_dir)
        proposer = OnnxProposer(self.graph(target, target_dir, drafter_dir)) if drafter_dir is not None else None
        return SpeculativeDecoder(target, proposer)
