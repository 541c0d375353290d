"""GPU check of the TensorRT-LLM export: build/load it, then greedy output must equal non-speculative output.

The one command (a CUDA machine with TensorRT-LLM installed; `tensorrt` ships with it):
    python scripts/gpu/trtllm_check.py --target TARGET_DIR --drafter DRAFTER_DIR

dflash route (TensorRT-LLM >= 1.3, parallel drafter): TensorRT-LLM's own DFlashDecodingConfig validates the
exported speculative_config; LLM(target, speculative_config) greedy tokens == LLM(target) greedy tokens, and its
acceptance must reach --min-acceptance-ratio of the torch reference's (a wrong conversion is lossless, so
only acceptance reveals it).
onnx route (any version/variant): the TensorRT builder builds drafter.onnx; its logits match the torch drafter
(fp32, TF32 off, <= 1e-3) and portable-spec's loop drafting with the engine emits the target's greedy tokens.
Exit code 0 = every check passed. Not run in CI (no GPU there); see docs/backends/tensorrt_llm.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from portable_spec.adapters.onnx import OnnxProposer  # noqa: E402
from portable_spec.adapters.onnx_export import INPUT_NAMES, OUTPUT_NAME, GraphMetadata  # noqa: E402
from portable_spec.adapters.tensorrt_llm import (  # noqa: E402
    DFLASH_MIN_VERSION, MANIFEST_FILE, ExportRequest, export_trtllm, parse_version,
)
from portable_spec.decode import GenerationConfig, SpeculativeDecoder  # noqa: E402
from portable_spec.spec import SpecError, read_config  # noqa: E402
from portable_spec.target import TargetModel  # noqa: E402

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
            raise SystemExit("TensorRT could not parse drafter.onnx: "
                             + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
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
        inputs = (features.float(), context_positions.long(), context_valid.bool(), block_ids.long(),
                  block_positions.long())
        feeds = [t.to("cuda").contiguous() for t in inputs]  # kept alive until the stream syncs
        for name, tensor in zip(INPUT_NAMES, feeds):
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
    drafter = target.load_drafter(args.drafter).to("cuda")  # shared embedding/LM head moved with the target
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(2, 37, drafter.config.feature_size, generator=generator).cuda()
    positions = torch.arange(37, device="cuda").expand(2, -1)
    valid = torch.ones(2, 37, dtype=torch.bool, device="cuda")
    k = drafter.config.block_size
    block = torch.randint(0, drafter.config.vocab_size, (2, 1, k), generator=generator).cuda()
    block_positions = (37 + torch.arange(k, device="cuda")).expand(2, 1, k)
    with torch.no_grad():
        expected = drafter.block_logits(block, block_positions, drafter.context_kv(features, positions),
                                        valid[:, None, :].expand(-1, k, -1)).float().cpu()
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


def check_dflash_route(args, manifest: dict) -> list[str]:
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import DFlashDecodingConfig, KvCacheConfig
    from transformers import AutoTokenizer

    spec_config = DFlashDecodingConfig(**manifest["speculative_config"])  # TensorRT-LLM's own validation
    params = SamplingParams(max_tokens=args.max_new_tokens, temperature=0.0)

    def generate(speculative_config):
        llm = LLM(model=args.target, speculative_config=speculative_config, max_batch_size=len(PROMPTS),
                  kv_cache_config=KvCacheConfig(enable_block_reuse=False, free_gpu_memory_fraction=0.5))
        try:
            outputs = llm.generate(PROMPTS, params)
            tau = [getattr(o, "avg_decoded_tokens_per_iter", None) for o in outputs]
            return [list(o.outputs[0].token_ids) for o in outputs], tau
        finally:
            llm.shutdown()

    spec_tokens, taus = generate(spec_config)
    plain_tokens, _ = generate(None)
    failures = [] if spec_tokens == plain_tokens else ["DFlash greedy tokens differ from non-speculative tokens"]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = TargetModel.load(args.target, dtype=torch.bfloat16)
    target.model.to("cuda")
    reference = SpeculativeDecoder(target, target.load_drafter(args.drafter).to("cuda")).generate(
        [tokenizer.encode(p) for p in PROMPTS],
        GenerationConfig(max_new_tokens=args.max_new_tokens, num_draft_tokens=manifest["num_draft_tokens"]))
    known = [t for t in taus if t is not None]
    tau = sum(known) / len(known) if known else float("nan")
    print(f"TensorRT-LLM DFlash tau={tau:.2f}, portable-spec reference tau={reference.stats.acceptance_length:.2f}; "
          f"greedy equal: {spec_tokens == plain_tokens}")
    if known and tau < args.min_acceptance_ratio * reference.stats.acceptance_length:
        failures.append(f"acceptance {tau:.2f} < {args.min_acceptance_ratio} x reference "
                        f"{reference.stats.acceptance_length:.2f}: the converted drafter does not draft like ours")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--route", default="auto", choices=("auto", "dflash", "onnx"),
                        help="auto: dflash where it can express the drafter, else onnx")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--min-acceptance-ratio", type=float, default=0.8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check needs a GPU")
    import tensorrt_llm

    version = tensorrt_llm.__version__
    route = args.route
    if route == "auto":
        dflash_ok = read_config(Path(args.drafter)).kind == "parallel" and parse_version(version) >= DFLASH_MIN_VERSION
        route = "dflash" if dflash_ok else "onnx"
    with tempfile.TemporaryDirectory() as tmp:
        request = ExportRequest(version, route=route, max_batch=len(PROMPTS), max_context=1024)
        try:
            out = export_trtllm(Path(args.drafter), Path(args.target), Path(tmp) / "export", request)
        except SpecError as error:
            raise SystemExit(f"export failed: {error}") from None
        manifest = json.loads((out / MANIFEST_FILE).read_text())
        print(f"TensorRT-LLM {version}, route={route}")
        failures = check_dflash_route(args, manifest) if route == "dflash" else check_onnx_route(args, out, manifest)
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else f"{len(failures)} check(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
