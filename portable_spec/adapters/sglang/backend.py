"""The SGLang entry in the conformance registry. SGLang's DFLASH runtime refuses CPU devices and its draft
attention backends are CUDA-only, so here it reports why it cannot run (a skip, never a pass); the drafter
module itself is checked against the reference in tests/engines/test_sglang_adapter.py, and the end-to-end run
is scripts/gpu/sglang_e2e.py on a GPU machine."""

from __future__ import annotations

from portable_spec.adapters.sglang.validate import installed_sglang_version
from portable_spec.adapters.shared_validate import ENGINE_KINDS
from portable_spec.core.backends import Backend

CPU_REFUSAL = "DFLASH speculative decoding is not supported by SRTPlatform on device 'cpu'."


class SglangBackend(Backend):
    name = "sglang"
    kinds_supported = ENGINE_KINDS

    def version(self) -> str | None:
        found = installed_sglang_version()
        return f"sglang {found}" if found else None

    def unavailable_reason(self) -> str | None:
        import torch

        if installed_sglang_version() is None:
            return "sglang is not installed here (pip install 'portable-spec[sglang]'; see .ci/sglang_engine_tests.sh)"
        if not torch.cuda.is_available():
            return f"SGLang's runtime needs CUDA: {CPU_REFUSAL!r}; run scripts/gpu/sglang_e2e.py on a GPU machine"
        return "the in-engine conformance run is scripts/gpu/sglang_e2e.py (greedy equality, tau, throughput)"

    def block_logits(self, *args, **kwargs):
        raise NotImplementedError(self.unavailable_reason())

    def generate(self, *args, **kwargs):
        raise NotImplementedError(self.unavailable_reason())
