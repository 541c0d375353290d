"""GPU check of the TensorRT-LLM adapter: inside TensorRT-LLM's own loop, greedy output must equal its output
without speculation, and acceptance must match portable-spec's reference decoder.

The one command (a CUDA machine with TensorRT-LLM and portable-spec installed; `tensorrt` ships with it):
    python scripts/gpu/trtllm_check.py --target TARGET_DIR --drafter DRAFTER_DIR [--drafter ...] [--out REPORT.json]

dflash route (TensorRT-LLM >= 1.3 for parallel, >= 1.4 for depth_causal): each drafter is exported with
`portable-spec export trtllm`; depth_causal drafters run through portable-spec's draft-model builder (plugin.py,
registered here exactly as the exported custom module dir does for trtllm-serve). TensorRT-LLM's own
DFlashDecodingConfig validates the exported speculative_config; then, on held-out prompts, greedy tokens of
LLM(target, speculative_config) must equal LLM(target)'s, acceptance (avg_decoded_tokens_per_iter) must be within
--tau-tolerance of the torch reference decoder's on the same prompts (a wrong conversion is lossless, so only
acceptance reveals it), and tokens/s with and without speculation are measured in the same run. One markdown table
is printed, the JSON report written to --out.
onnx route (any version/variant, --route onnx): the TensorRT builder builds drafter.onnx; its logits match the
torch drafter (fp32, TF32 off, <= 1e-3) and portable-spec's loop drafting with the engine emits the target's
greedy tokens.
Exit code 0 = every check passed. Not run yet (no GPU lent to this project so far); see docs/backends/tensorrt_llm.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from portable_spec.adapters.onnx import OnnxProposer  # noqa: E402
from portable_spec.adapters.onnx_export import OUTPUT_NAME, GraphMetadata, graph_inputs  # noqa: E402
from portable_spec.adapters.tensorrt_llm import MANIFEST_FILE, ExportRequest, export_trtllm  # noqa: E402
from portable_spec.adapters.tensorrt_llm.plugin import register  # noqa: E402
from portable_spec.core import fixtures, real_assets  # noqa: E402
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder  # noqa: E402
from portable_spec.core.spec import SpecError  # noqa: E402
from portable_spec.core.target import TargetModel  # noqa: E402

PROMPTS = ["def fibonacci(n):", "The three laws of thermodynamics are", "import os\nimport sys\n\ndef main():"]
ENGINE_TOLERANCE = 1e-3


class TensorRTGraph:
    """The drafter engine built by the TensorRT builder from drafter.onnx; same interface as OnnxDrafterGraph."""

    def __init__(self, graph_dir: Path, profile: dict[str, list[list[int]]]) -> None:
        import onnx
        import tensorrt as trt

        path = graph_dir / "drafter.onnx"
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        self.config = GraphMetadata.from_props(props, str(path)).drafter_config
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(path)):
            raise SystemExit(
                "TensorRT could not parse drafter.onnx: "
                + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            )
        build_config = builder.create_builder_config()
        build_config.clear_flag(trt.BuilderFlag.TF32)
        trt_profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.items():
            trt_profile.set_shape(name, low, opt, high)
        build_config.add_optimization_profile(trt_profile)
        plan = builder.build_serialized_network(network, build_config)
        if plan is None:
            raise SystemExit("TensorRT engine build failed (see the TensorRT log above)")
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
        self.context = self.engine.create_execution_context()

    def block_logits(self, features, context_positions, context_valid, block_ids, block_positions) -> torch.Tensor:
        inputs = graph_inputs(features, context_positions, context_valid, block_ids, block_positions)
        feeds = {name: t.to("cuda").contiguous() for name, t in inputs.items()}  # kept alive until the stream syncs
        for name, tensor in feeds.items():
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
        logits = torch.empty(tuple(self.context.get_tensor_shape(OUTPUT_NAME)), dtype=torch.float32, device="cuda")
        self.context.set_tensor_address(OUTPUT_NAME, logits.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise SystemExit("TensorRT execution failed")
        stream.synchronize()
        return logits.cpu()


def check_onnx_route(args, out: Path, manifest: dict) -> list[str]:
    failures = []
    graph = TensorRTGraph(out, manifest["build"]["profile"])
    target = TargetModel.load(args.target)
    target.model.to("cuda")
    drafter = target.load_drafter(args.drafter[0]).to("cuda")  # shared embedding/LM head moved with the target
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 37, drafter.config.feature_size, generator=generator).cuda()
    positions = torch.arange(37, device="cuda").expand(2, -1)
    valid = torch.ones(2, 37, dtype=torch.bool, device="cuda")
    k = drafter.config.block_size
    block = torch.randint(0, drafter.config.vocab_size, (2, 1, k), generator=generator).cuda()
    block_positions = (37 + torch.arange(k, device="cuda")).expand(2, 1, k)
    with torch.no_grad():
        expected = (
            drafter.block_logits(
                block, block_positions, drafter.context_kv(features, positions), valid[:, None, :].expand(-1, k, -1)
            )
            .float()
            .cpu()
        )
    error = (graph.block_logits(features, positions, valid, block, block_positions) - expected).abs().max().item()
    print(f"engine vs torch drafter: max abs logits error {error:.2e} (tolerance {ENGINE_TOLERANCE})")
    if not error <= ENGINE_TOLERANCE:
        failures.append(f"engine logits error {error:.2e} > {ENGINE_TOLERANCE}")
    prompts = [list(range(3, 3 + n)) for n in (5, 11, 17)]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, num_draft_tokens=k - 1)
    spec = SpeculativeDecoder(target, OnnxProposer(graph)).generate(prompts, config)
    plain = SpeculativeDecoder(target).generate(prompts, config)
    print(f"engine-drafted tau={spec.stats.acceptance_length:.2f}; greedy equal: {spec.tokens == plain.tokens}")
    if spec.tokens != plain.tokens:
        failures.append("greedy tokens with the TensorRT drafter differ from non-speculative decoding")
    return failures


def held_out_prompts(target_dir: str, count: int) -> list[list[int]]:
    """The fixture's or SmolLM2's held-out prompts (token ids), whichever target this is."""
    on_fixture = Path(target_dir).resolve() == fixtures.target_dir().resolve()
    return (fixtures.heldout_prompts() if on_fixture else real_assets.heldout_prompts())[:count]


def run_trtllm(args, prompts: list[list[int]], speculative_config) -> dict:
    """Greedy tokens, mean acceptance and steady-state tokens/s (after a one-prompt warm-up) of one LLM."""
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import KvCacheConfig

    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=0.0)
    llm = LLM(
        model=args.target,
        speculative_config=speculative_config,
        max_batch_size=args.batch_size,
        dtype=args.dtype,
        kv_cache_config=KvCacheConfig(enable_block_reuse=False, free_gpu_memory_fraction=0.5),
    )
    try:
        llm.generate(prompts[:1], params)
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
    finally:
        llm.shutdown()
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    taus = [t for o in outputs if (t := getattr(o, "avg_decoded_tokens_per_iter", None)) is not None]
    return {
        "tokens": tokens,
        "tau": sum(taus) / len(taus) if taus else None,
        "tokens_per_s": sum(map(len, tokens)) / seconds,
    }


def check_dflash_route(args, version: str, workdir: Path) -> tuple[dict, list[str]]:
    """Every drafter in TensorRT-LLM's DFlash mode next to TensorRT-LLM without speculation, one run."""
    from tensorrt_llm.llmapi import DFlashDecodingConfig

    prompts = held_out_prompts(args.target, args.num_prompts)
    base = run_trtllm(args, prompts, None)
    target = TargetModel.load(args.target, dtype=getattr(torch, args.dtype))
    target.model.to("cuda")
    report, failures = {"tensorrt_llm": version, "no_speculation_tokens_per_s": round(base["tokens_per_s"], 1)}, []
    for index, drafter_dir in enumerate(args.drafter):
        out = export_trtllm(
            Path(drafter_dir),
            Path(args.target),
            workdir / f"export-{index}",
            ExportRequest(version, route="dflash", dtype=args.dtype),
        )
        manifest = json.loads((out / MANIFEST_FILE).read_text())
        in_loop = "plugin" in manifest["build"]
        if in_loop:
            register()  # what `--custom_module_dirs OUT/portable_spec_trtllm` does for trtllm-serve
        spec = run_trtllm(args, prompts, DFlashDecodingConfig(**manifest["speculative_config"]))
        generation = GenerationConfig(max_new_tokens=args.max_new_tokens, num_draft_tokens=manifest["num_draft_tokens"])
        reference = SpeculativeDecoder(target, target.load_drafter(drafter_dir).to("cuda")).generate(
            prompts, generation
        )
        tau_ref = reference.stats.acceptance_length
        checks = {
            "greedy_spec_equals_no_spec": spec["tokens"] == base["tokens"],
            "tau_within_tolerance": spec["tau"] is not None
            and abs(spec["tau"] - tau_ref) <= args.tau_tolerance * tau_ref,
        }
        failures += [f"{manifest['variant']} ({drafter_dir}): {name}" for name, ok in checks.items() if not ok]
        report[manifest["variant"]] = {
            **checks,
            "drafter": str(drafter_dir),
            "in_loop_plugin": in_loop,
            "k": manifest["num_draft_tokens"],
            "tau_trtllm": spec["tau"],
            "tau_reference": round(tau_ref, 4),
            "tokens_per_s": round(spec["tokens_per_s"], 1),
            "speedup_vs_no_speculation": round(spec["tokens_per_s"] / base["tokens_per_s"], 3),
        }
    print(markdown_table(report))
    return report, failures


def markdown_table(report: dict) -> str:
    lines = [
        f"TensorRT-LLM {report['tensorrt_llm']}: no speculation {report['no_speculation_tokens_per_s']} tok/s",
        "",
        "| variant | in-loop plugin | k | greedy equal | tau TensorRT-LLM | tau reference | tok/s | speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, row in report.items():
        if isinstance(row, dict):
            lines.append(
                f"| {variant} | {row['in_loop_plugin']} | {row['k']} | {row['greedy_spec_equals_no_spec']} | "
                f"{row['tau_trtllm']} | {row['tau_reference']} | {row['tokens_per_s']} | "
                f"{row['speedup_vs_no_speculation']} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, action="append", help="repeat for several drafters")
    parser.add_argument(
        "--route",
        default="dflash",
        choices=("dflash", "onnx"),
        help="dflash: inside TensorRT-LLM's loop; onnx: a TensorRT drafter engine in portable-spec's",
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1, help="requests in flight (LLM max_batch_size)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16"),
        help="DFlash's attention kernels need half precision",
    )
    parser.add_argument("--tau-tolerance", type=float, default=0.02)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON report here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check needs a GPU")
    import tensorrt_llm

    version = tensorrt_llm.__version__
    print(f"TensorRT-LLM {version}, route={args.route}")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.route == "dflash":
                report, failures = check_dflash_route(args, version, Path(tmp))
            else:
                request = ExportRequest(version, route="onnx", max_batch=len(PROMPTS), max_context=1024)
                out = export_trtllm(Path(args.drafter[0]), Path(args.target), Path(tmp) / "export", request)
                manifest = json.loads((out / MANIFEST_FILE).read_text())
                report, failures = {"tensorrt_llm": version, "route": "onnx"}, check_onnx_route(args, out, manifest)
        except SpecError as error:
            raise SystemExit(f"error: {error}") from None
    report["passed"] = not failures
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
