"""Golden verification vectors: what every backend's verifier must reproduce exactly.

Files in golden/ are written once by make_golden.py from the reference verifier and checked in; the suite
only reads them. Noise is stored as its key (seed, request ids, first positions) plus a sha256 of the
uniforms `VerifyNoise.for_chain` must regenerate from it, so a change to the noise stream fails loudly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, SamplingParams
from portable_spec.core.spec import SpecError

FORMAT_VERSION = 1
GOLDEN_DIR = Path(__file__).parent / "golden"
# every tag a case may carry; the suite asserts each is covered by at least one file
TAGS = (
    "greedy",
    "temperature",
    "top_k",
    "top_p",
    "ties",
    "all_accept",
    "first_reject",
    "ragged",
    "batch",
    "draft_probs",
    "no_drafts",
    "mixed_params",
)


class GoldenError(SpecError):
    """A golden file that cannot be used; the message names the file, the field and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoiseKey(_Strict):
    seed: int = Field(ge=0, lt=2**64, description="Noise seed (both 32-bit halves are used by the key).")
    request_ids: list[int] = Field(description="[B] request id per row: the Philox key's second word.")
    first_positions: list[int] = Field(description="[B] position of the first token the step decides.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Of accept then sample uniforms, float32 LE.")


class GoldenInputs(_Strict):
    target_logits: list[list[list[float]]] = Field(description="[B, n+1, V] float32 values.")
    draft_tokens: list[list[int]] = Field(description="[B, n]; slots past num_drafts[b] are padding.")
    draft_probs: list[list[list[float]]] | None = Field(description="[B, n, V] q; null = one-hot drafts.")
    num_drafts: list[int] | None = Field(description="[B] ragged draft counts; null = all n.")
    sampling: list[SamplingParams] = Field(description="[B] per-request sampling settings.")
    noise: NoiseKey


class GoldenExpected(_Strict):
    accepted_len: list[int] = Field(description="[B] exact.")
    next_token: list[int] = Field(description="[B] recovered or bonus token, exact.")
    output_tokens: list[list[int]] = Field(description="[B, n+1] accepted drafts, next token, -1 padding; exact.")
    target_probs: list[list[list[float]]] = Field(description="[B, n+1, V] p after sampling; to 1e-6.")


class GoldenCase(_Strict):
    format_version: int = Field(description=f"Golden format version; this suite reads {FORMAT_VERSION}.")
    name: str = Field(description="File stem; the check id is golden/<name>.")
    description: str
    tags: list[str] = Field(description=f"Subset of {TAGS}.")
    written_with: dict[str, str] = Field(description="Versions the generator ran with (informative).")
    inputs: GoldenInputs
    expected: GoldenExpected


@dataclass
class GoldenTensors:
    """A case as the tensors `Backend.verify` takes, and the tensors it must return."""

    target_logits: torch.Tensor  # [B, n+1, V] float32
    draft_tokens: torch.Tensor  # [B, n] int64
    draft_probs: torch.Tensor | None  # [B, n, V] float32
    num_drafts: torch.Tensor | None  # [B] int64
    sampling: SamplingBatch
    noise: VerifyNoise
    accepted_len: torch.Tensor  # [B]
    next_token: torch.Tensor  # [B]
    output_tokens: torch.Tensor  # [B, n+1]
    target_probs: torch.Tensor  # [B, n+1, V]


def noise_sha256(noise: VerifyNoise) -> str:
    digest = hashlib.sha256()
    for uniforms in (noise.accept_uniform, noise.sample_uniform):
        digest.update(uniforms.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tobytes())
    return digest.hexdigest()


def regenerate_noise(key: NoiseKey, num_drafts: int, vocab_size: int) -> VerifyNoise:
    return VerifyNoise.for_chain(
        key.seed, torch.tensor(key.request_ids), torch.tensor(key.first_positions), num_drafts, vocab_size
    )


def case_paths(golden_dir: Path = GOLDEN_DIR) -> list[Path]:
    return sorted(golden_dir.glob("*.json"))


def load_case(path: Path) -> GoldenCase:
    raw = json.loads(Path(path).read_text())
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise GoldenError(
            f"{path}: format_version={version!r}, this suite reads {FORMAT_VERSION}; "
            "update portable_spec/conformance/golden.py to the newer format instead of editing the file"
        )
    case = GoldenCase.model_validate(raw)
    unknown = sorted(set(case.tags) - set(TAGS))
    if unknown:
        raise GoldenError(f"{path}: tags {unknown} are unknown; valid options: {', '.join(TAGS)}")
    if case.name != Path(path).stem:
        raise GoldenError(f"{path}: name={case.name!r} differs from the file stem; the check id comes from the name")
    return case


def to_tensors(case: GoldenCase) -> GoldenTensors:
    """Tensors for one case; the regenerated noise must match the stored checksum."""
    inputs, expected = case.inputs, case.expected
    target_logits = torch.tensor(inputs.target_logits, dtype=torch.float32)
    batch, chain, vocab = target_logits.shape
    noise = regenerate_noise(inputs.noise, chain - 1, vocab)
    if noise_sha256(noise) != inputs.noise.sha256:
        raise GoldenError(
            f"golden/{case.name}.json: VerifyNoise.for_chain no longer regenerates the stored noise "
            "(sha256 differs); portable_spec/core/noise.py changed its keyed stream, which breaks "
            "cross-backend determinism: restore it (golden files are never regenerated)"
        )
    return GoldenTensors(
        target_logits=target_logits,
        draft_tokens=torch.tensor(inputs.draft_tokens, dtype=torch.int64).reshape(batch, chain - 1),
        draft_probs=None if inputs.draft_probs is None else torch.tensor(inputs.draft_probs, dtype=torch.float32),
        num_drafts=None if inputs.num_drafts is None else torch.tensor(inputs.num_drafts, dtype=torch.int64),
        sampling=SamplingBatch.from_params(inputs.sampling),
        noise=noise,
        accepted_len=torch.tensor(expected.accepted_len, dtype=torch.int64),
        next_token=torch.tensor(expected.next_token, dtype=torch.int64),
        output_tokens=torch.tensor(expected.output_tokens, dtype=torch.int64),
        target_probs=torch.tensor(expected.target_probs, dtype=torch.float32),
    )


def dumps(value: object, indent: int = 0) -> str:
    """JSON with every list of scalars on one line, so a [B, n+1, V] tensor reads as rows."""
    pad = " " * indent
    if isinstance(value, dict):
        items = [f"{pad} {json.dumps(k)}: {dumps(v, indent + 1).lstrip()}" for k, v in value.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and any(isinstance(v, (list, dict)) for v in value):
        return pad + "[\n" + ",\n".join(dumps(v, indent + 1) for v in value) + "\n" + pad + "]"
    return pad + json.dumps(value)
