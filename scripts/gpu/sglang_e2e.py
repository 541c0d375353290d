"""GPU check of the SGLang adapter: SGLang serving a portable-spec drafter under --speculative-algorithm DFLASH.

The one command (a CUDA machine; `pip install -e '.[sglang]'` there, which pins sglang==0.5.23 and installs the
`sglang.srt.plugins` entry point):
    python scripts/gpu/sglang_e2e.py --target TARGET_DIR --drafter DRAFTER_DIR [--out sglang_e2e.json]
Defaults: the shipped fixture target and its depth_causal drafter (portable_spec/assets).

Checks, exit code 0 = all passed:
  1. greedy output ids with the drafter == without it, prompt by prompt at concurrency 1 (the deterministic
     setting; batched runs are reported, not asserted: batching alone changes floating-point results);
  2. SGLang's acceptance length (completion tokens / verify passes) >= --min-acceptance-ratio x the
     portable-spec reference decoder's on the same prompts (a wrong drafter port stays lossless: only
     acceptance reveals it, e.g. a block mask that is not causal on the CUDA attention backend);
  3. with --other-target: launching with a target the drafter was not trained for fails with
     "drafter/target mismatch" (the binding check in portable_spec/adapters/sglang/worker.py).
Reported: tokens/s without and with speculation at each --concurrency, speedup, acceptance length.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from portable_spec.adapters.sglang.validate import ALGORITHM, check_servable, check_sglang_version, portable_config_of  # noqa: E402
from portable_spec.core import fixtures  # noqa: E402
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder  # noqa: E402
from portable_spec.core.target import TargetModel  # noqa: E402

PROMPTS = [
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
    "import os\nimport sys\n\ndef main():",
    "Write a haiku about the sea.",
    "class Stack:\n    def __init__(self):",
    "SELECT name FROM users WHERE",
    "The capital of France is",
    "for i in range(10):",
]


def make_prompts(target: Path, count: int) -> list[list[int]]:
    if target.resolve() == fixtures.target_dir().resolve():
        held = fixtures.heldout_prompts()
        return [held[i % len(held)] for i in range(count)]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    return [tokenizer.encode(f"{PROMPTS[i % len(PROMPTS)]}  # {i}") for i in range(count)]


class Run:
    """One sglang.Engine (with or without the drafter): greedy ids per prompt, throughput per concurrency."""

    def __init__(self, args, speculative: bool) -> None:
        import sglang

        options = dict(
            model_path=str(args.target),
            dtype=args.dtype,
            disable_radix_cache=True,
            max_running_requests=max(args.concurrency),
            mem_fraction_static=args.mem_fraction,
        )
        if args.attention_backend:
            options["attention_backend"] = args.attention_backend
        if args.disable_cuda_graph:
            options["disable_cuda_graph"] = True
        if speculative:
            options.update(speculative_algorithm=ALGORITHM, speculative_draft_model_path=str(args.drafter))
            if args.num_draft_tokens:
                options["speculative_num_draft_tokens"] = args.num_draft_tokens
        self.engine = sglang.Engine(**options)
        self.params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}

    def generate(self, prompts: list[list[int]]) -> tuple[list[dict], float]:
        start = time.perf_counter()
        outputs = self.engine.generate(input_ids=prompts, sampling_params=self.params)
        return outputs, time.perf_counter() - start

    def close(self) -> None:
        self.engine.shutdown()


def measure(args, speculative: bool, prompts: list[list[int]]) -> dict:
    run = Run(args, speculative)
    try:
        run.generate(prompts[:1])  # warm-up (CUDA graphs, allocator)
        singles = [run.generate([p])[0][0] for p in prompts[: args.num_prompts]]
        result = {"ids": [o["output_ids"] for o in singles], "accept_length": accept_length(singles), "by_c": {}}
        for c in args.concurrency:
            outputs, seconds = run.generate(prompts[:c])
            tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
            result["by_c"][c] = {
                "tokens_per_s": tokens / seconds,
                "accept_length": accept_length(outputs),
                "ids": [o["output_ids"] for o in outputs],
            }
        return result
    finally:
        run.close()


def accept_length(outputs: list[dict]) -> float | None:
    """Completion tokens per verify pass over all requests (SGLang's meta_info; None without speculation)."""
    verify = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outputs)
    return sum(o["meta_info"]["completion_tokens"] for o in outputs) / verify if verify else None


def reference_accept_length(args, prompts: list[list[int]], num_drafts: int) -> float:
    target = TargetModel.load(args.target, dtype=getattr(torch, args.dtype))
    target.model.to("cuda")
    drafter = target.load_drafter(args.drafter).to("cuda")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, num_draft_tokens=num_drafts)
    emitted = []
    for prompt in prompts:  # batch 1, like the concurrency-1 SGLang runs
        emitted += SpeculativeDecoder(target, drafter).generate([prompt], config).stats.emitted_per_round
    del target, drafter
    torch.cuda.empty_cache()
    return sum(emitted) / len(emitted)


def check_other_target(args) -> str | None:
    code = (
        f"import sglang; sglang.Engine(model_path={str(args.other_target)!r}, dtype={args.dtype!r}, "
        f"speculative_algorithm={ALGORITHM!r}, speculative_draft_model_path={str(args.drafter)!r})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and "drafter/target mismatch" in done.stdout + done.stderr:
        return None
    return (
        f"launch with --other-target {args.other_target} did not fail with 'drafter/target mismatch' "
        f"(exit code {done.returncode})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=fixtures.target_dir())
    parser.add_argument("--drafter", type=Path, default=fixtures.drafter_dir("depth_causal"))
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="SGLang's --speculative-num-draft-tokens (anchor + drafts); default: block_size",
    )
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts checked one by one for greedy equality")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--attention-backend", default=None, help="passed to SGLang (draft uses the same)")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--mem-fraction", type=float, default=0.6)
    parser.add_argument("--min-acceptance-ratio", type=float, default=0.8)
    parser.add_argument("--other-target", type=Path, default=None, help="a target the drafter was NOT trained for")
    parser.add_argument("--out", type=Path, default=Path("sglang_e2e.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: SGLang refuses DFLASH on CPU (docs/backends/sglang.md); run this on a GPU")
    version = check_sglang_version()
    config = portable_config_of(args.drafter)
    if config is None:
        raise SystemExit(f"{args.drafter}: not a portable-spec drafter checkpoint (config.json without variant)")
    check_servable(config, str(args.drafter))
    width = args.num_draft_tokens or config.block_size

    prompts = make_prompts(args.target, max(max(args.concurrency), args.num_prompts))
    plain = measure(args, speculative=False, prompts=prompts)
    spec = measure(args, speculative=True, prompts=prompts)
    reference = reference_accept_length(args, prompts[: args.num_prompts], num_drafts=width - 1)

    failures = [
        f"prompt {i}: greedy ids differ from position {first_difference(a, b)}"
        for i, (a, b) in enumerate(zip(spec["ids"], plain["ids"], strict=True))
        if a != b
    ]
    if spec["accept_length"] is None or spec["accept_length"] < args.min_acceptance_ratio * reference:
        failures.append(
            f"acceptance length {spec['accept_length']} < {args.min_acceptance_ratio} x reference "
            f"{reference:.2f}: SGLang does not draft like the portable-spec reference"
        )
    if args.other_target is not None and (failure := check_other_target(args)):
        failures.append(failure)

    print(
        f"sglang {version}, drafter {config.kind} block_size={config.block_size}, num_draft_tokens={width}, "
        f"dtype={args.dtype}"
    )
    print(
        f"acceptance length at concurrency 1: sglang {spec['accept_length'] or float('nan'):.2f}, "
        f"reference {reference:.2f}"
    )
    print(f"{'concurrency':>11} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} {'accept':>7} {'same ids':>9}")
    rows = []
    for c in args.concurrency:
        p, s = plain["by_c"][c], spec["by_c"][c]
        same = sum(a == b for a, b in zip(s["ids"], p["ids"], strict=True))
        rows.append(
            {
                "concurrency": c,
                "plain_tokens_per_s": p["tokens_per_s"],
                "spec_tokens_per_s": s["tokens_per_s"],
                "speedup": s["tokens_per_s"] / p["tokens_per_s"],
                "accept_length": s["accept_length"],
                "identical_outputs": f"{same}/{c}",
            }
        )
        print(
            f"{c:>11} {p['tokens_per_s']:>12.1f} {s['tokens_per_s']:>11.1f} {rows[-1]['speedup']:>8.2f} "
            f"{s['accept_length'] or float('nan'):>7.2f} {same:>5}/{c:<3}"
        )
    args.out.write_text(
        json.dumps(
            {
                "sglang": version,
                "target": str(args.target),
                "drafter": str(args.drafter),
                "kind": config.kind,
                "num_draft_tokens": width,
                "dtype": args.dtype,
                "accept_length": spec["accept_length"],
                "reference_accept_length": reference,
                "rows": rows,
                "failures": failures,
            },
            indent=2,
        )
        + "\n"
    )
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    sys.exit(main())
