"""What a target directory must be before it is served: a local decoder-only causal LM whose weights all load.

Without these checks transformers loads an encoder (BERT) or a drafter directory with randomly initialised heads,
and decoding produces fluent-looking garbage; a missing directory becomes a hub "Repo id" message. Every refusal
is one SpecError naming the path and the fix.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError

from portable_spec.core.errors import first_line
from portable_spec.core.spec import SpecError, is_drafter_config, read_json_object

FIX = "pass a local Hugging Face causal-LM directory (config.json + weights), e.g. `portable-spec fetch-target smollm2`"
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")  # Qwen3ForCausalLM, LlamaForCausalLM, GPT2LMHeadModel, ...


# (field, lowest, highest): sizes a decoder-only LM's config.json can sanely hold; outside them transformers would
# try to build the model anyway (100000 layers: minutes of allocation, then an out-of-memory kill)
CONFIG_BOUNDS = (
    ("num_hidden_layers", 1, 1024),
    ("hidden_size", 1, 1 << 16),
    ("vocab_size", 1, 1 << 24),
    ("num_attention_heads", 1, 1024),
    ("num_key_value_heads", 1, 1024),
    ("intermediate_size", 1, 1 << 20),
    ("max_position_embeddings", 1, 1 << 24),
    ("head_dim", 1, 4096),
)


def check_config_values(config: dict, path: Path) -> None:
    """Sizes, vocabulary, positions and rope base within sane bounds, before any weights are allocated."""
    for name, low, high in CONFIG_BOUNDS:
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SpecError(
                f"target={path}: config.json {name}={value!r} is outside [{low}, {high}]; the file is "
                "damaged or not this model's: restore the model's config.json"
            )
    thetas = [config.get("rope_theta"), (config.get("rope_parameters") or {}).get("rope_theta")]
    for theta in [t for t in thetas if t is not None]:
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
            raise SpecError(
                f"target={path}: config.json rope_theta={theta!r} must be a finite positive number; "
                "restore the model's config.json"
            )


def check_target_dir(path: Path) -> dict:
    """The target directory's config.json as a dict, or a SpecError saying what the directory is instead."""
    if path.is_symlink() and not path.exists():
        raise SpecError(f"target={path}: a broken symlink or a symlink loop; pass the model directory itself")
    if not path.exists():
        raise SpecError(f"target={path}: not found; {FIX}")
    if not path.is_dir():
        raise SpecError(f"target={path}: is a file, not a model directory; {FIX}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise SpecError(f"target={path}: no config.json file in it; {FIX}")
    config = read_json_object(config_file, "restore the model's config.json")
    if is_drafter_config(config):
        raise SpecError(
            f"target={path}: is a portable-spec drafter checkpoint, not a target; pass it as --drafter "
            "and the model it was trained for as --target"
        )
    architectures = config.get("architectures") or []
    if config.get("is_encoder_decoder") or not any(a.endswith(CAUSAL_SUFFIXES) for a in architectures):
        raise SpecError(
            f"target={path}: architectures={architectures} is not a decoder-only causal LM (a class "
            f"ending in {' or '.join(CAUSAL_SUFFIXES)}); speculative decoding needs one; {FIX}"
        )
    check_config_values(config, path)
    return config


def load_causal_lm(path: str | Path, dtype: torch.dtype):
    """AutoModelForCausalLM from a directory check_target_dir passed (TargetModel.load checks it first); refused
    unless every weight loaded and none was left over."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, attn_implementation="sdpa", output_loading_info=True
        )
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:
        raise SpecError(f"target={path}: transformers could not load it ({first_line(error)}); {FIX}") from None
    problems = {kind: sorted(info.get(kind) or []) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems or info.get("error_msgs"):
        shown = "; ".join(f"{kind}: {keys[:3]}{' ...' if len(keys) > 3 else ''}" for kind, keys in problems.items())
        raise SpecError(
            f"target={path}: its weights do not match its config ({shown or info['error_msgs'][0]}); the "
            f"model would run with randomly initialised parts; {FIX}"
        )
    return model


def load_tokenizer(path: str | Path, need_eos: bool = True):
    """The target's tokenizer; refused when it cannot load, or has no EOS id where generation must stop on one."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SpecError(
            f"target={path}: its tokenizer could not load ({first_line(error)}); the target directory "
            "needs the tokenizer files saved with the model"
        ) from None
    if need_eos and tokenizer.eos_token_id is None:
        raise SpecError(
            f"target={path}: its tokenizer has no EOS token id, so generation could not stop; set "
            "eos_token in tokenizer_config.json"
        )
    return tokenizer
