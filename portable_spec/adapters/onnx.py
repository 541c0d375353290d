"""ONNX Runtime backend: the exported bound drafter graph drafts, the reference loop verifies.

The graph has no KV cache input, so the proposer's state is the raw context (features, positions) and each
round reruns the graph over it; the reference proposer caches K/V instead, which is the same math. A sequential
head's drafts come from the exported step graph run slot after slot in the reference's own chain
(core/head_step.py `chain_drafts`), so its greedy drafts and, at T > 0, its draws from portable-spec's sampler are
the reference's.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from portable_spec.adapters.onnx_export import (
    GRAPH_FILE,
    HIDDEN_OUTPUT,
    OUTPUT_NAME,
    STEP_FILE,
    STEP_INPUTS,
    GraphMetadata,
    export_bound_drafter,
    graph_inputs,
    session_options,
)
from portable_spec.core.backends import DecoderBackend, ReferenceBackend
from portable_spec.core.decode import SpeculativeDecoder
from portable_spec.core.drafter import anchor_block, greedy_drafts
from portable_spec.core.head_step import chain_drafts, chain_slots
from portable_spec.core.spec import DrafterConfig, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.core.variants import behaviour_of


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
        self.sequential_head = behaviour_of(self.config.kind).sequential_head
        self.step_session = self._step_session(path) if self.sequential_head else None

    def _step_session(self, path: Path):
        """The head's step graph beside the block graph; refused unless both come from one export."""
        import onnxruntime as ort

        step_path = path.parent / STEP_FILE
        if not step_path.exists():
            raise SpecError(
                f"{step_path}: not found; a {self.config.kind} export holds the head's step graph beside "
                f"{path.name}: re-export with `portable-spec export onnx DRAFTER OUT --target T`"
            )
        session = ort.InferenceSession(str(step_path), session_options(), providers=["CPUExecutionProvider"])
        if GraphMetadata.from_props(session.get_modelmeta().custom_metadata_map, str(step_path)) != self.metadata:
            raise SpecError(f"{step_path}: its metadata differ from {path.name}'s; the two graphs come from two "
                            "exports: re-export the drafter into one directory")  # fmt: skip
        return session

    def step(self, hidden, logits, previous, state) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One slot of the head (head_step.SlotStep) in onnxruntime."""
        feeds = {name: t.detach().cpu().numpy() for name, t in zip(STEP_INPUTS, (hidden, logits, previous, state))}
        outputs = [torch.from_numpy(output) for output in self.step_session.run(None, feeds)]
        return outputs[0], outputs[1], outputs[2] if len(outputs) > 2 else None

    def block_logits(self, features, context_positions, context_valid, block_ids, block_positions) -> torch.Tensor:
        """One pass, shapes as the graph contract (onnx_export.py); blocks shorter than k only if block-causal."""
        return self.block_outputs(features, context_positions, context_valid, block_ids, block_positions)[0]

    def block_outputs(self, features, context_positions, context_valid, block_ids, block_positions):
        """(logits [B, 1, width, V], a sequential head's final states [B, 1, width, H] or None)."""
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
        names = [OUTPUT_NAME, HIDDEN_OUTPUT] if self.sequential_head else [OUTPUT_NAME]
        outputs = [torch.from_numpy(output)[..., :width, :] for output in self.session.run(names, feeds)]
        return outputs[0], outputs[1] if self.sequential_head else None


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
        if self.behaviour.sequential_head:
            return self.propose_sampled(state, valid, anchor_tokens, anchor_positions, num_drafts, None)[:2]
        k = self.config.block_size  # the graph's block is fixed at export
        positions = anchor_positions.cpu()[:, None, None] + torch.arange(k)
        run = lambda ids: self.graph.block_logits(state.features, state.positions, valid, ids, positions)  # noqa: E731
        tokens, probability = greedy_drafts(run, self.config, anchor_tokens.cpu(), num_drafts, k)
        return tokens.to(anchor_tokens.device), probability.to(anchor_tokens.device)

    @property
    def samples_drafts(self) -> bool:
        """A sequential head samples its drafts at T > 0 (proposer.py), as the reference proposer does."""
        return self.behaviour.sequential_head

    def propose_sampled(self, state: OnnxContext, valid, anchor_tokens, anchor_positions, num_drafts, sampler):
        """A sequential head's chain over the block graph's final states, the step graph per slot (greedy when
        sampler is None)."""
        k, device = self.config.block_size, anchor_tokens.device
        anchors = anchor_tokens.cpu()
        positions = anchor_positions.cpu()[:, None, None] + torch.arange(k)
        block = anchor_block(self.config, anchors, k)
        logits, hidden = self.graph.block_outputs(state.features, state.positions, valid, block, positions)
        slots = chain_slots(self.config)
        start = hidden.new_zeros(len(anchors), slots.state_size)
        logits = logits[:, 0, slots.first :]  # chain_drafts takes the logits from the chain's first slot on
        out = chain_drafts(self.graph.step, slots, hidden[:, 0], logits, anchors, num_drafts, start, sampler)
        return tuple(None if t is None else t.to(device) for t in out)

    def passes_per_round(self, num_drafts: int) -> int:
        return num_drafts if self.behaviour.autoregressive else 1


class OnnxBackend(DecoderBackend):
    """Drafting in onnxruntime from the exported graph; `drafter_dir` is a graph dir or a checkpoint to export."""

    name = "onnx"

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
