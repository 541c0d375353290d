"""Small random-weight models for numerics and plumbing tests (never for acceptance claims: use fixtures)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from portable_spec.core.drafter import Drafter
from portable_spec.core.target import TargetModel, drafter_config_for

TINY_TARGET = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=128,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)


def tiny_target(seed: int = 0, **overrides) -> TargetModel:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**{**TINY_TARGET, **overrides}))
    return TargetModel(model.eval(), f"tiny-random-{seed}")


def tiny_drafter(
    target: TargetModel, kind: str, block_size: int = 8, seed: int = 1, num_hidden_layers: int = 2, **options
) -> Drafter:
    """`options`: drafter_config_for's layer_types, sliding_window, window_rule, block_attention, rope_scaling,
    hidden_size, draft_vocab_size."""
    config = drafter_config_for(
        target,
        kind=kind,
        block_size=block_size,
        num_hidden_layers=num_hidden_layers,
        target_layer_ids=[0, 1],
        mask_token_id=target.config.vocab_size - 1,
        **options,
    )
    torch.manual_seed(seed)
    drafter = target.bind(Drafter(config))
    with torch.no_grad():  # move shift-mix, DFlash2's convolutions and DSpark's bias off their start, so they count
        for name, param in drafter.named_parameters():
            if name.endswith("shift_mix.weight"):
                param.add_(0.05 * torch.randn_like(param))
            elif name.endswith(("base_kernel", "kernel_projection.weight")):
                param.add_(0.2 * torch.randn_like(param) / (param.shape[-1] ** 0.5 if param.dim() == 2 else 1))
            elif "candidate_selector." in name:  # bigram scores as large as the logits' spread: picks change
                param.mul_(50.0)
            elif name == "markov_head.markov_w1.weight":  # a Markov bias as large as the logits' spread
                param.mul_(300.0)
            elif name == "embed_proj.2.weight":  # a Domino correction as large as the logits' spread
                param.mul_(30.0)
    return drafter.eval()


def save_tiny_pair(out: Path, kind: str = "depth_causal", seed: int = 0) -> tuple[Path, Path]:
    """Write a random tiny target (HF dir) and a bound drafter checkpoint under `out`."""
    target = tiny_target(seed)
    target.model.save_pretrained(out / "target")
    drafter = tiny_drafter(target, kind)
    drafter.save(out / f"drafter-{kind}")
    return out / "target", out / f"drafter-{kind}"
