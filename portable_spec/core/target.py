"""The target model: any HF transformers causal LM, run with a KV cache over a slot layout with holes.

Rejected draft slots stay in the cache but are masked out (the 2-D attention mask), and the tail that no
request still uses is cropped, so batch rows with different acceptance lengths share one cache.
"""

from __future__ import annotations

import inspect
from functools import cached_property
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from portable_spec.core.binding import check_target_matches, target_fingerprint
from portable_spec.core.drafter import Drafter, SharedTargetModules, load_drafter
from portable_spec.core.spec import DrafterConfig, SpecError, parse_config
from portable_spec.core.target_checks import check_target_dir, load_causal_lm, load_tokenizer


def stored_weight(path: Path, model: PreTrainedModel, weight: torch.Tensor) -> torch.Tensor:
    """`weight` of `model` as its directory's safetensors hold it (tied weights: whichever name was saved)."""
    from safetensors import safe_open

    names = [name for name, param in model.named_parameters(remove_duplicate=False) if param is weight]
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for name in names:
                if name in handle.keys():
                    return handle.get_tensor(name)
    raise SpecError(
        f"target={path}: no safetensors file holds {names} as stored; the float16 fingerprint is taken from "
        "the stored weights: load the target in float32 or bfloat16"
    )


class TargetModel:
    """A causal LM plus what the drafter needs from it: features at chosen layers, embedding, LM head."""

    def __init__(self, model: PreTrainedModel, model_id: str, tokenizer=None) -> None:
        self.model = model.eval()
        self.model_id = model_id
        self.tokenizer = tokenizer  # loaded only when asked (TargetModel.load(..., tokenizer=True))
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"

    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype = torch.float32, tokenizer: bool = False) -> "TargetModel":
        """A local decoder-only causal LM whose weights all loaded, else one SpecError (target_checks). The one
        target loader: the directory is checked once, then (tokenizer=True) its tokenizer with an EOS id, so every
        refusal comes before the weights load."""
        path = Path(path)
        check_target_dir(path)
        loaded_tokenizer = load_tokenizer(path) if tokenizer else None
        return cls(load_causal_lm(path, dtype), str(path), loaded_tokenizer)

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vocab_size(self) -> int:
        """Rows of the target's embedding: the token ids it accepts (config.vocab_size may differ when padded)."""
        return self.model.get_input_embeddings().weight.shape[0]

    @cached_property
    def fingerprint(self) -> str:
        """Of the embedding and head as stored: loaded in float16, they are read back from the directory's
        safetensors, since fp16 flushes bf16/fp32 values below its range and rounds twice, so the loaded copy
        would fingerprint as another target (issue 47: a float16 run refused its own drafters)."""
        embedding, head = self.model.get_input_embeddings().weight, self.model.get_output_embeddings().weight
        if self.model.dtype == torch.float16:
            embedding, head = (stored_weight(Path(self.model_id), self.model, w) for w in (embedding, head))
        return target_fingerprint(embedding, head)

    def binding(self, model_id: str | None = None) -> dict:
        """The `target` fields of a drafter config bound to this model (spec.TargetBinding)."""
        return {
            "model_id": model_id or self.model_id,
            "architecture": type(self.model).__name__,
            "hidden_size": self.config.hidden_size,
            "num_hidden_layers": self.config.num_hidden_layers,
            "vocab_size": self.vocab_size,
            "fingerprint": self.fingerprint,
        }

    def shared_modules(self) -> SharedTargetModules:
        return SharedTargetModules(self.model.get_input_embeddings(), self.model.get_output_embeddings())

    def embedding_and_head(self, draft_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The target's embedding [V, H] and LM head (its rows at `draft_ids` for a draft vocabulary) on the CPU,
        under the names a drafter with own_embeddings stores them; what a shared drafter embeds and scores with."""
        head = self.model.get_output_embeddings().weight.detach().cpu()
        return {
            "embed_tokens.weight": self.model.get_input_embeddings().weight.detach().cpu(),
            "lm_head.weight": head if draft_ids is None else head[draft_ids],
        }

    def check_drafter(self, config: DrafterConfig) -> None:
        check_target_matches(
            config,
            hidden_size=self.config.hidden_size,
            num_hidden_layers=self.config.num_hidden_layers,
            vocab_size=self.vocab_size,
            fingerprint=self.fingerprint,
            served_as=f"target {self.model_id!r}",
        )

    def bind(self, drafter: Drafter) -> Drafter:
        """The one place a drafter and this target are checked as a pair (check_drafter): on success the drafter
        takes this target's embedding and LM head. The decoder and the exporters only ask `is_bound`."""
        self.check_drafter(drafter.config)
        drafter.shared = self.shared_modules()
        return drafter

    def is_bound(self, drafter: Drafter) -> bool:
        """Whether `drafter` holds this very model's embedding and LM head (bound by `bind`)."""
        shared = drafter.shared
        return (
            shared is not None
            and shared.embed_tokens is self.model.get_input_embeddings()
            and shared.lm_head is self.model.get_output_embeddings()
        )

    def require_bound(self, drafter: Drafter) -> None:
        if not self.is_bound(drafter):
            raise SpecError(
                f"drafter is not bound to target {self.model_id!r}; load it with target.load_drafter(dir) "
                "(or bind a drafter you built with target.bind(drafter))"
            )

    def load_drafter(self, ckpt_dir: str | Path) -> Drafter:
        """Load a drafter in this target's dtype and bind it; refused (at load, not mid-generation) if it was
        trained for another target."""
        return self.bind(load_drafter(Path(ckpt_dir), dtype=self.model.dtype))

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.config)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, n]
        positions: torch.Tensor,  # [B, n]
        attention_mask: torch.Tensor,  # [B, cached + n] bool: which slots are real
        cache: DynamicCache,
        layer_ids: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, n, V] and, if layer_ids, features [B, n, len(layer_ids) * H] (outputs of those layers)."""
        # No holes (always so at batch 1: rejected slots are the cropped tail): let HF build the causal mask itself,
        # which takes SDPA's unmasked fast path for single-token steps.
        mask = None if bool(attention_mask.all()) else attention_mask.to(torch.long)
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            output_hidden_states=layer_ids is not None,
            **{self._cache_kwarg: cache},
        )
        features = None if layer_ids is None else _layer_features(out.hidden_states, layer_ids)
        return out.logits, features

    @torch.no_grad()
    def features(
        self, input_ids: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, layer_ids: list[int]
    ) -> torch.Tensor:
        """Features [B, n, len(layer_ids) * H] of a right-padded batch (valid [B, n]) from a fresh context: the
        decoder stack only, no LM head and no cache (what training reads, cached or computed in the step)."""
        mask = None if bool(valid.all()) else valid.to(torch.long)
        out = self.model.base_model(
            input_ids=input_ids, position_ids=positions, attention_mask=mask, use_cache=False, output_hidden_states=True
        )
        return _layer_features(out.hidden_states, layer_ids)


def drafter_config_for(
    target: TargetModel,
    *,
    kind: str,
    block_size: int,
    num_hidden_layers: int,
    target_layer_ids: list[int],
    mask_token_id: int,
    intermediate_size: int | None = None,
    draft_vocab_size: int | None = None,
    model_id: str | None = None,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
    block_attention: str | None = None,
    rope_scaling: dict | None = None,
    hidden_size: int | None = None,
    window_rule: str | None = None,
    variant_options: dict | None = None,
) -> DrafterConfig:
    """A drafter config shaped like the target's layers (same width, heads, rope), bound to the target; sliding
    layers, the block attention and the variant's own fields (`variant_options`, e.g. a dflash2's conv and
    selector sizes) as given (spec.py says what each means). A `hidden_size` other than the target's makes a drafter
    of that width with its own embedding and LM head."""
    t = target.config
    width = hidden_size or t.hidden_size
    options = {
        key: value
        for key, value in (
            ("layer_types", layer_types),
            ("sliding_window", sliding_window),
            ("window_rule", window_rule),
            ("rope_scaling", rope_scaling),
            ("own_embeddings", width != t.hidden_size),
        )
        if value
    }
    return parse_config(
        {
            "variant": {
                "kind": kind,
                **({"block_attention": block_attention} if block_attention else {}),
                **(variant_options or {}),
            },
            **options,
            "block_size": block_size,
            "num_hidden_layers": num_hidden_layers,
            "hidden_size": width,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "head_dim": getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
            "intermediate_size": intermediate_size or t.intermediate_size,
            "rms_norm_eps": t.rms_norm_eps,
            "rope_theta": float(getattr(t, "rope_theta", None) or t.rope_parameters["rope_theta"]),
            "vocab_size": target.vocab_size,
            "mask_token_id": mask_token_id,
            **({"draft_vocab_size": draft_vocab_size} if draft_vocab_size is not None else {}),
            "target_layer_ids": target_layer_ids,
            "target": target.binding(model_id),
        }
    )


def _layer_features(hidden: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """The outputs of layers `layer_ids` side by side; hidden[0] is the embedding, hidden[-1] the post-norm output."""
    if max(layer_ids) + 2 >= len(hidden):
        raise SpecError(
            f"target_layer_ids={layer_ids} reach past the target's {len(hidden) - 1} layers; "
            "use ids <= num_hidden_layers - 2 (the last hidden state is post-norm)"
        )
    return torch.cat([hidden[i + 1] for i in layer_ids], dim=-1)
