"""Binding a drafter to a target: the fingerprint that refuses a drafter trained for another model."""

from __future__ import annotations

import hashlib

import torch

from portable_spec.core.spec import DrafterConfig, SpecError


def target_fingerprint(embedding: torch.Tensor, lm_head: torch.Tensor) -> str:
    """sha256 over the shared embedding and LM head, rounded to bf16 so fp32/bf16 loads agree."""
    digest = hashlib.sha256()
    for weight in (embedding, lm_head):
        rounded = weight.detach().to("cpu", torch.bfloat16).contiguous()
        digest.update(str(tuple(rounded.shape)).encode())
        digest.update(rounded.view(torch.int16).numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def check_target_matches(
    config: DrafterConfig,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    vocab_size: int,
    fingerprint: str | None,
    served_as: str = "target",
) -> None:
    """Fail at load time when the served target is not the one the drafter was trained for."""
    expected = config.target
    problems = []
    if hidden_size != expected.hidden_size:
        problems.append(f"hidden_size: drafter expects {expected.hidden_size}, {served_as} has {hidden_size}")
    if num_hidden_layers != expected.num_hidden_layers:
        problems.append(
            f"num_hidden_layers: drafter expects {expected.num_hidden_layers}, {served_as} has {num_hidden_layers}"
        )
    if vocab_size != expected.vocab_size:
        problems.append(f"vocab_size: drafter expects {expected.vocab_size}, {served_as} has {vocab_size}")
    if fingerprint is not None and not problems and fingerprint != expected.fingerprint:
        problems.append(
            f"fingerprint: drafter was trained for {expected.model_id!r} ({expected.fingerprint[:19]}...), "
            f"{served_as} has {fingerprint[:19]}... (different embedding/LM head)"
        )
    if problems:
        raise SpecError(
            "drafter/target mismatch: "
            + "; ".join(problems)
            + f"; fix: serve the target the drafter was trained for ({expected.model_id!r}) "
            "or train a drafter for this target with `portable-spec train`"
        )
