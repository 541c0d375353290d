"""SGLang's DFlash worker, unchanged, behind one startup check: the served target is the drafter's target.

DFlashWorkerV2 receives the already-loaded target worker, so this is the first place that sees the target's
weights: shapes are compared there, and the fingerprint (embedding + LM head) too when this rank holds the
whole vocabulary (tensor parallel 1). Imports SGLang: loaded only by the plugin's create_worker hook.
"""

from __future__ import annotations

import logging

from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from portable_spec.adapters.sglang.validate import check_served_target, portable_config_of
from portable_spec.core.spec import DrafterConfig

logger = logging.getLogger(__name__)


def check_loaded_target(config: DrafterConfig, target_model, model_config, source: str) -> bool:
    """Compare an SGLang-loaded target (model + sglang ModelConfig) with the drafter's binding.

    Returns whether the fingerprint was compared (False under tensor parallelism: vocab-sharded weights)."""
    text_config = model_config.hf_text_config
    embedding = target_model.get_input_embeddings()
    lm_head = getattr(target_model, "lm_head", None)
    return check_served_target(
        config,
        hidden_size=int(text_config.hidden_size),
        num_hidden_layers=int(text_config.num_hidden_layers),
        vocab_size=int(model_config.vocab_size),
        embedding=getattr(embedding, "weight", None),
        lm_head=getattr(lm_head, "weight", None),
        served_as=f"served target {model_config.model_path!r} (drafter {source})",
    )


class PortableSpecDFlashWorker(DFlashWorkerV2):
    """DFlashWorkerV2 for a portable-spec drafter: refuses a target the drafter was not trained for."""

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> None:
        source = str(resolving_view(server_args).speculative_draft_model_path)
        config = portable_config_of(source)
        if config is not None:
            runner = target_worker.model_runner
            compared = check_loaded_target(config, runner.model, runner.model_config, source)
            logger.info(
                "portable-spec: served target matches drafter %s (shapes%s)",
                source,
                " + fingerprint" if compared else "; fingerprint skipped: vocab-sharded weights",
            )
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
