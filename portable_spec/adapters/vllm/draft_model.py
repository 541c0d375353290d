"""portable-spec drafters as vLLM DFlash draft models. Imports vLLM: load it through the plugin or a test.

Everything that runs is vLLM's DFlash (vllm 0.32, `model_executor/models/qwen3_dflash.py`): target hidden-state
capture at `dflash_config.target_layer_ids` (vLLM aux layer i + 1 = the output of layer i, our convention), the
context path fc -> hidden_norm -> per-layer K/V written into the drafter's KV cache by the proposer, the layers,
the final norm and the target's shared embedding and LM head. Causal block attention needs no code (config.json
carries `is_causal: true`). The one forward difference, depth_causal's shift-mix, is the core `ShiftMix`.

A reduced draft vocabulary (config.json `draft_vocab_size`, weights `d2t`) is vLLM's own EAGLE-3 layout: its
DFlash model builds a [draft_vocab, H] LM head and maps draft ids to target ids with `d2t` in compute_logits. A
portable checkpoint without own_embeddings carries no LM head (it scores the target's rows), so where vLLM would
share the target's full head, the draft head is filled with the target's rows at the draft ids instead
(`_PortableDraft.__setattr__`).

A drafter with own_embeddings (e.g. one narrower than its target) ships `embed_tokens` and `lm_head`; vLLM loads them
and keeps them (its proposer shares the target's only when the checkpoint has none, or identical ones), and sizes
fc's input from config.json's `target_hidden_size`. vLLM then never hands the drafter the target's embedding or
head, so the served target is checked by shape only (width, layers, vocabulary), not by fingerprint.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size, tensor_model_parallel_all_gather
from vllm.model_executor.models.qwen3_dflash import (
    DFlashQwen3DecoderLayer,
    DFlashQwen3ForCausalLM,
    DFlashQwen3Model,
)
from vllm.transformers_utils.repo_utils import get_hf_file_bytes

from portable_spec.adapters import shared_validate
from portable_spec.adapters.vllm import validate
from portable_spec.core.binding import check_target_matches, target_fingerprint
from portable_spec.core.drafter import WeightCheck
from portable_spec.core.drafter_layers import ShiftMix
from portable_spec.core.spec import DrafterConfig, SpecError


def _draft_source(vllm_config: VllmConfig) -> str:
    return str(vllm_config.speculative_config.draft_model_config.model)


def _portable_config(vllm_config: VllmConfig) -> DrafterConfig | None:
    """The drafter's own config.json (not vLLM's rewritten hf_config, which e.g. adopts the target's vocab)."""
    draft = vllm_config.speculative_config.draft_model_config
    raw = get_hf_file_bytes("config.json", draft.model, draft.revision)
    return shared_validate.portable_config_of(raw, f"{draft.model}/config.json")


def _full_vocab_rows(weight: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[padded vocab (/ TP shard), H] -> [vocab, H]: vLLM shards vocab rows across TP ranks and pads the end."""
    if get_tensor_model_parallel_world_size() > 1:
        weight = tensor_model_parallel_all_gather(weight.contiguous(), dim=0)
    return weight[:vocab_size]


class _PortableDraft(DFlashQwen3ForCausalLM):
    """vLLM's DFlash draft model plus the load-time checks: servable variant, method, K, the served target (shapes
    before building, the embedding/LM-head fingerprint once vLLM shares them in) and complete weights.
    A checkpoint that is not portable-spec's (no `format_version`) is left entirely to vLLM."""

    requires_portable = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        portable = _portable_config(vllm_config)
        if portable is None and self.requires_portable:
            raise SpecError(
                f"{_draft_source(vllm_config)}: {type(self).__name__} serves portable-spec checkpoints only "
                "(config.json with format_version and variant); write the drafter with portable-spec"
            )
        if portable is not None:
            self._check_before_build(portable, vllm_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.portable = portable
        self.served_target = vllm_config.model_config
        self._binding_checked = portable is None
        # vLLM's own [draft_vocab, H] head, kept unregistered: vLLM deletes `lm_head` before sharing the target's
        self.__dict__["_draft_vocab_head"] = self.lm_head
        self._watch_lm_head = True  # from here on, an lm_head assignment is vLLM sharing the target's in

    @staticmethod
    def _check_before_build(portable: DrafterConfig, vllm_config: VllmConfig) -> None:
        source = _draft_source(vllm_config)
        spec = vllm_config.speculative_config
        validate.check_servable(portable, source)
        validate.check_method(spec.method, source)
        validate.check_num_speculative_tokens(portable, spec.num_speculative_tokens, source)
        target = vllm_config.model_config
        check_target_matches(
            portable,
            hidden_size=target.get_hidden_size(),
            num_hidden_layers=target.get_total_num_hidden_layers(),
            vocab_size=target.get_vocab_size(),
            fingerprint=None,
            served_as=f"served target {target.model!r}",
        )

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name == "lm_head" and self.__dict__.get("_watch_lm_head"):
            self.check_shared_target()  # both runners share embed_tokens first, then lm_head
            # (an own head is shared only when identical to the target's: then there is no draft vocabulary)
            portable = self.portable
            if portable is not None and portable.draft_vocab_size is not None and not portable.own_embeddings:
                super().__setattr__(name, self._fill_draft_vocab_head(value))

    def _fill_draft_vocab_head(self, target_head: torch.nn.Module) -> torch.nn.Module:
        """The draft-vocabulary head holding the target head's rows at the draft ids (target id = draft id +
        d2t[draft id]): the rows the reference drafter scores (Drafter.scored_logits)."""
        head = self.__dict__["_draft_vocab_head"]
        ids = torch.arange(self.portable.draft_vocab_size)
        if self.draft_id_to_target_id is not None:  # None when draft_vocab_size == vocab_size (vLLM's rule)
            ids = ids + self.draft_id_to_target_id.detach().cpu()
        rows = _full_vocab_rows(target_head.weight, self.portable.vocab_size)[ids.to(target_head.weight.device)]
        head.weight_loader(head.weight, rows.to(head.weight.dtype))
        # vLLM's post-load step for this layer (on CPU it prepacks the weight for its GEMM: without it, logits
        # would come from the rows as they were at load time)
        head.quant_method.process_weights_after_loading(head)
        return head

    def check_shared_target(self) -> None:
        """Refuse a served target whose embedding/LM head differ from the ones the drafter was trained with."""
        if self._binding_checked:
            return
        vocab = self.portable.vocab_size
        fingerprint = None  # a drafter with its own embedding and head is never handed the target's
        if not self.portable.own_embeddings:
            fingerprint = target_fingerprint(
                _full_vocab_rows(self.model.embed_tokens.weight, vocab), _full_vocab_rows(self.lm_head.weight, vocab)
            )
        target = self.served_target
        check_target_matches(
            self.portable,
            hidden_size=target.get_hidden_size(),
            num_hidden_layers=target.get_total_num_hidden_layers(),
            vocab_size=target.get_vocab_size(),
            fingerprint=fingerprint,
            served_as=f"served target {target.model!r}",
        )
        self._binding_checked = True

    def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None) -> None:
        self.check_shared_target()  # no-op once checked; catches a vLLM that shares the weights another way
        super().precompute_and_store_context_kv(context_states, context_positions, context_slot_mapping)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        if self.portable is None:
            return super().load_weights(weights)
        check = WeightCheck(self.portable, f"{self.draft_model_config.model}/model.safetensors")

        def checked():
            for name, tensor in weights:
                check.see(name, tuple(tensor.shape))
                yield name, tensor

        loaded = super().load_weights(checked())
        check.finish()
        return loaded


class ParallelDraft(_PortableDraft):
    """The parallel variant is vLLM's DFlash unchanged; registered as DFlashDraftModel for the checks above."""

    requires_portable = False


class DepthCausalDecoderLayer(DFlashQwen3DecoderLayer):
    """h_j <- W [h_j ; h_{j-1}] on the residual stream (core ShiftMix, `layers.{i}.shift_mix.weight` [H, 2H]),
    then vLLM's DFlash layer."""

    def __init__(self, vllm_config: VllmConfig, *, config, layer_idx: int, **kwargs) -> None:
        super().__init__(vllm_config, config=config, layer_idx=layer_idx, **kwargs)
        self.shift_mix = ShiftMix(config.hidden_size)
        # The proposer lays out each request's query block [anchor, MASK x K] contiguously (query_start_loc =
        # arange * (K + 1)), both model runners; rows past the last block are padding.
        self.block_len = vllm_config.speculative_config.num_speculative_tokens + 1

    def forward(self, positions, hidden_states, residual):
        stream = hidden_states if residual is None else hidden_states + residual  # vLLM fuses add+norm lazily
        return super().forward(positions, self.shift_mix.mix_rows(stream, self.block_len), None)


class DepthCausalModel(DFlashQwen3Model):  # inherits vLLM's torch.compile wrapper: do not decorate again
    decoder_layer_cls = DepthCausalDecoderLayer


class DepthCausalDraft(_PortableDraft):
    """depth_causal: registered as DFlashDepthCausalDraftModel (the architecture in its config.json)."""

    model_cls = DepthCausalModel


class AutoregressiveRefused(_PortableDraft):
    """Registered for the autoregressive architecture names so vLLM refuses such a drafter at startup with the
    reason (check_servable), instead of 'architecture not supported'."""
