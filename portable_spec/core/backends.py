"""The one backend registry, and the small interface a backend implements to join the conformance suite.

Backends are registered by entry point (module:Class) and imported lazily, so importing the core never imports an engine.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import ClassVar

import torch

from portable_spec.core.decode import GenerationConfig, GenerationOutput, SpeculativeDecoder
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch
from portable_spec.core.spec import VARIANT_KINDS, SpecError
from portable_spec.core.target import TargetModel
from portable_spec.core.verify import VerifyResult, verify


@dataclass(frozen=True)
class Acceptance:
    """How a backend's drafts fared on a batch: what engines count (vLLM's spec_decode_num_drafts,
    num_accepted_tokens and num_accepted_tokens_per_pos) and, where a backend exposes it, each request's
    accepted length per round."""

    tokens: list[list[int]]
    rounds: int  # verification rounds that scored drafts, summed over requests
    accepted_per_position: list[int]  # [num_draft_tokens]: rounds in which draft j was accepted
    accepted_by_request: list[list[int]] | None = None  # per request, accepted drafts per round

    @property
    def tau(self) -> float:
        """Mean tokens emitted per round: 1 + accepted drafts / rounds."""
        return 1 + sum(self.accepted_per_position) / max(self.rounds, 1)

    @classmethod
    def of_output(cls, output: GenerationOutput, num_draft_tokens: int) -> "Acceptance":
        by_request = output.stats.accepted_by_request
        rounds = [accepted for request in by_request for accepted in request]
        per_position = [sum(accepted > j for accepted in rounds) for j in range(num_draft_tokens)]
        return cls(output.tokens, len(rounds), per_position, [list(request) for request in by_request])


class Backend(ABC):
    """A place the drafter + verifier run. Every method must agree with ReferenceBackend (exactly for tokens)."""

    name: ClassVar[str]
    kinds_supported: ClassVar[tuple[str, ...]] = VARIANT_KINDS  # drafter kinds this backend can run
    # pytest marker of its column in tests/conformance (an engine built by its own CI stage, deselected by default)
    pytest_marker: ClassVar[str | None] = None

    def unavailable_reason(self) -> str | None:
        """None when this backend can run here; otherwise why not (reported as skipped, never as passed)."""
        return None

    def version(self) -> str | None:
        """The engine/runtime and its version, for the report header (None: nothing beyond portable-spec)."""
        return None

    @abstractmethod
    def block_logits(
        self,
        target_dir: Path,
        drafter_dir: Path,
        features: torch.Tensor,  # [B, T, F] target features at the drafter's layers
        context_positions: torch.Tensor,  # [B, T]
        context_valid: torch.Tensor,  # [B, T] bool
        block_ids: torch.Tensor,  # [B, 1, k]
        block_positions: torch.Tensor,  # [B, 1, k]
    ) -> torch.Tensor:  # [B, 1, k, V] float32
        """One drafter pass over one block per request."""

    def target_forward(
        self,
        target_dir: Path,
        chain_ids: torch.Tensor,  # [B, n] token ids, scored from scratch (no cache)
        positions: torch.Tensor,  # [B, n] sequence positions
        layer_ids: list[int],  # target layers whose OUTPUT is captured (HF output_hidden_states[i + 1])
    ) -> tuple[torch.Tensor, torch.Tensor]:  # logits [B, n, V] float32, features [B, n, len(layer_ids) * H]
        """Target logits and drafter features for a chain. Optional: the suite reports a skip until implemented.

        vLLM/SGLang capture the state ENTERING layer i + 1 for id i; this is where that shift is checked.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement target_forward")

    def verify(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        sampling: SamplingBatch,
        noise: VerifyNoise,
        draft_probs: torch.Tensor | None = None,
        num_drafts: torch.Tensor | None = None,
    ) -> VerifyResult:
        """Default: the shared verifier. A backend with its own kernel overrides this."""
        return verify(target_logits, draft_tokens, sampling, noise, draft_probs, num_drafts)

    @abstractmethod
    def generate(
        self, target_dir: Path, drafter_dir: Path | None, prompts: list[list[int]], config: GenerationConfig
    ) -> list[list[int]]:
        """End-to-end decode; drafter_dir None = the backend's own non-speculative decoding."""

    def acceptance(
        self, target_dir: Path, drafter_dir: Path, prompts: list[list[int]], config: GenerationConfig
    ) -> Acceptance:
        """Speculative decode with the backend's acceptance counters. Optional: a skip until implemented."""
        raise NotImplementedError(f"{type(self).__name__} does not report acceptance")

    def reads_layout(self, layout: str) -> bool:
        """Whether the backend loads a drafter in this upstream layout (zlab, specforge, speculators) itself, as
        its users would hand it over; otherwise the import checks give it the portable import."""
        return False


class DecoderBackend(Backend):
    """A backend that drafts inside the reference decode loop (with its own proposer and the shared verifier):
    `decoder` is what it brings; generate and acceptance are the loop's."""

    @abstractmethod
    def decoder(self, target_dir: Path, drafter_dir: Path | None) -> SpeculativeDecoder:
        """The reference loop over this backend's drafter; drafter_dir None: the target decodes alone."""

    def generate(self, target_dir, drafter_dir, prompts, config):
        return self.decoder(target_dir, drafter_dir).generate(prompts, config).tokens

    def acceptance(self, target_dir, drafter_dir, prompts, config):
        output = self.decoder(target_dir, drafter_dir).generate(prompts, config)
        return Acceptance.of_output(output, config.num_draft_tokens)


class ReferenceBackend(DecoderBackend):
    """The specification: the torch drafter, the shared verifier and the reference decode loop."""

    name = "reference"

    def block_logits(
        self, target_dir, drafter_dir, features, context_positions, context_valid, block_ids, block_positions
    ):
        target = TargetModel.load(target_dir)
        drafter = target.load_drafter(drafter_dir)
        context = drafter.context_kv(features, context_positions)
        k = block_ids.shape[-1]
        mask = context_valid[:, None, :].expand(-1, k, -1)
        with torch.no_grad():
            return drafter.block_logits(block_ids, block_positions, context, mask, context_positions).float()

    def target_forward(self, target_dir, chain_ids, positions, layer_ids):
        target = TargetModel.load(target_dir)
        valid = torch.ones_like(chain_ids, dtype=torch.bool)
        logits, features = target.forward(chain_ids, positions, valid, target.new_cache(), list(layer_ids))
        return logits.float(), features.float()

    def decoder(self, target_dir: Path, drafter_dir: Path | None) -> SpeculativeDecoder:
        target = TargetModel.load(target_dir)
        return SpeculativeDecoder(target, target.load_drafter(drafter_dir) if drafter_dir is not None else None)


# What a conformance check exercises -> the backend methods that run it: a component is the reference's own
# when every one of them is (generate through DecoderBackend is the reference's only with the reference's decoder).
COMPONENTS: dict[str, tuple[str, ...]] = {
    "verify": ("verify",),
    "target_forward": ("target_forward",),
    "block_logits": ("block_logits",),
    "generate": ("generate", "decoder"),
    "acceptance": ("acceptance", "decoder"),
}


def is_reference(backend: Backend) -> bool:
    """The specification itself (not a subclass that replaces any part of it)."""
    return type(backend) is ReferenceBackend


def inherited_components(backend: Backend) -> dict[str, str]:
    """component -> the reference function a backend runs for it unchanged (Backend.verify is the shared
    verifier, the reference's): a check of such a component compares the reference with itself."""
    found = {}
    for component, methods in COMPONENTS.items():
        if all(getattr(type(backend), m, None) is getattr(ReferenceBackend, m) for m in methods):
            found[component] = " + ".join(getattr(ReferenceBackend, m).__qualname__ for m in methods)
    return found


BACKEND_GROUP = "portable_spec.backends"


def _registered_backends() -> dict[str, str]:
    """name -> "module:Class" from the `portable_spec.backends` entry-point group (pyproject.toml), reference
    first: an adapter registers itself there, so adding an engine edits no core module."""
    found = {entry.name: entry.value for entry in entry_points(group=BACKEND_GROUP)}
    found.setdefault("reference", f"{__name__}:ReferenceBackend")  # the core's own backend, installed or not
    return {"reference": found.pop("reference"), **dict(sorted(found.items()))}


# The one registry, read once at import (tests add toy backends to it).
BACKENDS: dict[str, str] = _registered_backends()


def backend_names() -> list[str]:
    return list(BACKENDS)


def backend_class(name: str) -> type[Backend]:
    try:
        module_name, class_name = BACKENDS[name].split(":")
    except KeyError:
        raise SpecError(f"backend {name!r} is unknown; valid options: {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module_name), class_name)


def get_backend(name: str) -> Backend:
    return backend_class(name)()
