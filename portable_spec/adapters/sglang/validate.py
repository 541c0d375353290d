"""What the SGLang adapter checks, with no SGLang import: version, checkpoint, speculative options, binding.

SGLang's `--speculative-num-draft-tokens` is the verify width (anchor + drafts) = the drafter block it runs;
portable-spec's `num_draft_tokens` counts drafts only, so SGLang's value is ours + 1.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import torch
from safetensors import safe_open

from portable_spec.adapters import shared_validate
from portable_spec.core.binding import check_target_matches, target_fingerprint
from portable_spec.core.checkpoint import WEIGHTS_FILE
from portable_spec.core.drafter import check_weight_shapes
from portable_spec.core.spec import DepthCausalVariant, DrafterConfig, SpecError

SUPPORTED_SGLANG_VERSIONS = ("0.5.23",)
ALGORITHM = "DFLASH"  # the SGLang algorithm that serves portable-spec drafters
DEPTH_CAUSAL_ARCHITECTURE = DepthCausalVariant.engine_architecture
# Names a user may try as --speculative-algorithm; each gets a pointer to DFLASH instead of "Unknown name".
OUR_NAMES = ("PORTABLE_SPEC", "PORTABLE-SPEC", "DEPTH_CAUSAL", "DEPTH-CAUSAL", "PARALLEL", "AUTOREGRESSIVE")


def installed_sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str:
    """The adapter wraps SGLang DFlash internals that change between releases: refuse any other version."""
    version = installed_sglang_version() if version is None else version
    if version is None:
        raise SpecError(
            "sglang is not installed; install the supported release with: pip install 'portable-spec[sglang]'"
        )
    if version not in SUPPORTED_SGLANG_VERSIONS:
        raise SpecError(
            f"sglang=={version} is installed, but portable-spec's SGLang adapter supports sglang "
            f"{', '.join(SUPPORTED_SGLANG_VERSIONS)} only (it wraps DFlash internals that change between releases); "
            f"fix: pip install 'sglang=={SUPPORTED_SGLANG_VERSIONS[-1]}' (or pip install 'portable-spec[sglang]')"
        )
    return version


def portable_config_of(path: str | Path | None) -> DrafterConfig | None:
    """The drafter config if `path` is a local portable-spec checkpoint; None for anything else (hub ids,
    other drafters), so SGLang runs those untouched. A portable checkpoint that is invalid raises SpecError."""
    config_file = Path(path) / "config.json" if path else None
    if config_file is None or not config_file.is_file():
        return None
    try:
        raw = config_file.read_bytes()
    except OSError:
        return None
    return shared_validate.portable_config_of(raw, str(config_file))


# Kinds beyond DFlash's shape that sglang 0.5.23 serves with its own class from a portable checkpoint as it is:
# DFlash2 (models/dflash.py `DFlash2DraftModel`: the convolutions around each sublayer and the candidate selector under
# our parameter names, its switches read from dflash_config; checked on CPU in tests/engines/test_sglang_adapter.py).
NATIVE_KINDS = ("dflash2",)


def check_servable(config: DrafterConfig, source: str) -> None:
    """Refuse the drafter kinds SGLang cannot run."""
    shared_validate.check_servable(config, source, "SGLang", "DFLASH worker", native_kinds=NATIVE_KINDS)


def check_algorithm(algorithm: str | None, source: str) -> None:
    """A portable checkpoint is served by DFLASH; any other --speculative-algorithm is refused, naming DFLASH."""
    if algorithm is not None and algorithm.upper() != ALGORITHM:
        raise SpecError(
            f"{source}: --speculative-algorithm {algorithm} cannot serve a portable-spec drafter; "
            f"use --speculative-algorithm {ALGORITHM} (the variant, parallel, depth_causal or dflash2, comes from config.json)"
        )


def hint_for_unknown_algorithm(algorithm: str) -> str | None:
    """What to say instead of SGLang's 'Unknown speculative algorithm name' when the name is one of ours."""
    if algorithm.upper() not in OUR_NAMES:
        return None
    return (
        f"--speculative-algorithm {algorithm} is not an SGLang algorithm: portable-spec drafters run under "
        f"--speculative-algorithm {ALGORITHM} --speculative-draft-model-path <drafter dir> "
        "(the variant, parallel, depth_causal or dflash2, comes from the checkpoint's config.json)"
    )


def check_speculative_options(
    config: DrafterConfig,
    *,
    num_draft_tokens: int | None,
    dflash_block_size: int | None,
    draft_window_size: int | None,
    source: str,
) -> None:
    """Options that would run the drafter on something other than what it was trained on are refused.

    num_draft_tokens: SGLang's verify width (= the block it runs); None means SGLang reads block_size.
    """
    for flag, width in (
        ("--speculative-num-draft-tokens", num_draft_tokens),
        ("--speculative-dflash-block-size", dflash_block_size),
    ):
        if width is None:
            continue
        width = int(width)
        if not config.block_causal and width != config.block_size:
            raise SpecError(
                f"{source}: {flag} {width} runs a {width}-slot block, but this {config.kind} drafter attends "
                f"bidirectionally across its whole {config.block_size}-slot block, so a different block is not "
                f"what it was trained for. fix: {flag} {config.block_size}, or omit it (SGLang reads block_size "
                "from config.json)"
            )
        if not 2 <= width <= config.block_size:
            raise SpecError(
                f"{source}: {flag} {width} is outside 2..{config.block_size}: the value is anchor + drafts and "
                f"this drafter was trained with block_size={config.block_size}. fix: pick 2..{config.block_size} "
                "(a depth_causal block is causal, so a shorter block drafts the same tokens as the prefix of the "
                "full one)"
            )
    if draft_window_size is not None:
        raise SpecError(
            f"{source}: --speculative-draft-window-size {draft_window_size} keeps only part of the context in the "
            "draft KV cache; portable-spec drafters are specified (and tested against the reference) over the "
            "full context. fix: drop --speculative-draft-window-size"
        )


def check_weight_names(ckpt_dir: str | Path, config: DrafterConfig) -> None:
    """SGLang's DFlash loader silently skips unknown names and leaves missing ones at init: check the safetensors
    header (names and shapes, no tensor read) with the core drafter's own check."""
    path = Path(ckpt_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise SpecError(f"{path}: not found; a drafter checkpoint needs {WEIGHTS_FILE} beside config.json")
    with safe_open(str(path), framework="pt") as weights:
        found = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    check_weight_shapes(config, found, str(path))


def check_served_target(
    config: DrafterConfig,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    vocab_size: int,
    embedding: torch.Tensor | None = None,  # [>= vocab_size, H] served rows (SGLang pads the vocab)
    lm_head: torch.Tensor | None = None,  # [>= vocab_size, H]
    served_as: str = "served target",
) -> bool:
    """The core binding check on what SGLang serves; returns whether the fingerprint was compared.

    The fingerprint needs the full embedding and LM head: with tensor parallelism each rank holds a vocab
    shard, so pass None there and only the shapes are checked.
    """
    fingerprint = None
    whole = [w for w in (embedding, lm_head) if w is not None and w.is_floating_point() and w.shape[0] >= vocab_size]
    if len(whole) == 2:
        fingerprint = target_fingerprint(embedding[:vocab_size], lm_head[:vocab_size])
    check_target_matches(
        config,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        vocab_size=vocab_size,
        fingerprint=fingerprint,
        served_as=served_as,
    )
    return fingerprint is not None
