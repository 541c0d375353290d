"""TensorRT-LLM export routes without TensorRT-LLM (never imported here): files, configs, weights, graph numerics.

dflash route: parallel drafters for TensorRT-LLM >= 1.3 -> DFlash HF checkpoint + DFlashDecodingConfig.
onnx route: any variant/version -> TensorRT-builder graph, checked in onnxruntime (max abs error <= 1e-4).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from portable_spec.checkpoint import OUTPUT_MARKER

pytest.importorskip("onnxruntime")

from portable_spec.adapters.onnx import OnnxDrafterGraph  # noqa: E402
from portable_spec.adapters.tensorrt_llm import (  # noqa: E402
    DRAFT_DIR, LLM_API_OPTIONS_FILE, MANIFEST_FILE, DFlashSpeculativeConfig, ExportRequest, dflash_weights,
    export_for_trtllm, export_trtllm, validate_speculative_config,
)
from portable_spec.cli import main  # noqa: E402
from portable_spec.drafter import Drafter  # noqa: E402
from portable_spec.spec import VARIANT_KINDS, SpecError  # noqa: E402
from portable_spec.target import TargetModel  # noqa: E402
from portable_spec.testing import save_tiny_pair  # noqa: E402

TOLERANCE = 1e-4
# DFlashDecodingConfig's fields in the 1.3.0rc27 API reference; what we emit must be a subset.
DFLASH_DECODING_CONFIG_FIELDS = {
    "max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency", "draft_len_schedule",
    "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold", "use_rejection_sampling",
    "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty", "mask_token_id", "target_layer_ids",
    "decoding_type", "attention_backend",
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("trtllm")
    return {kind: save_tiny_pair(root / kind, kind) for kind in VARIANT_KINDS}


def load(pairs, kind: str) -> tuple[TargetModel, Drafter]:
    target_dir, drafter_dir = pairs[kind]
    target = TargetModel.load(target_dir)
    return target, target.load_drafter(drafter_dir)


def assert_no_output(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp dir left behind"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dflash_route_parallel(pairs, tmp_path, dtype):
    target, drafter = load(pairs, "parallel")
    out = export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.3.0rc27", dtype=dtype))
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    spec = manifest["speculative_config"]
    assert manifest["route"] == "dflash" and manifest["num_draft_tokens"] == 7
    assert set(spec) <= DFLASH_DECODING_CONFIG_FIELDS
    assert validate_speculative_config(spec) == DFlashSpeculativeConfig(
        max_draft_len=7, speculative_model=str((tmp_path / "out" / DRAFT_DIR).resolve()), mask_token_id=255,
        target_layer_ids=[0, 1])
    assert Path(spec["speculative_model"]).is_dir()  # points at the final dir, not the temp one

    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load((out / LLM_API_OPTIONS_FILE).read_text()) == {"speculative_config": spec}

    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(out / DRAFT_DIR)  # a valid HF config: what TRT-LLM's loader parses
    assert hf.model_type == "qwen3" and hf.architectures == ["DFlashDraftModel"]
    assert hf.dflash_config == {"mask_token_id": 255, "target_layer_ids": [0, 1], "block_size": 8,
                                "num_target_layers": 3}
    assert hf.block_size == 8 and hf.num_hidden_layers == 2 and hf.head_dim == 32

    # Weights round-trip: same names, shapes and values (exact in float32, exactly rounded in bfloat16).
    weights = load_file(str(out / DRAFT_DIR / "model.safetensors"))
    original = drafter.state_dict()
    assert set(weights) == set(original)
    for name, tensor in weights.items():
        assert tensor.dtype == getattr(torch, dtype)
        assert torch.equal(tensor, original[name].to(tensor.dtype)), name
    if dtype == "float32":  # rebuilt from the converted files, the drafter computes the same logits
        rebuilt = Drafter(drafter.config, target.shared_modules())
        rebuilt.load_state_dict(weights)
        context = drafter.context_kv(torch.randn(2, 6, 128), torch.arange(6).expand(2, -1))
        block = torch.randint(0, 255, (2, 1, 8))
        positions = (6 + torch.arange(8)).expand(2, 1, 8)
        mask = torch.ones(2, 8, 6, dtype=torch.bool)
        with torch.no_grad():
            assert torch.equal(rebuilt.eval().block_logits(block, positions, context, mask),
                               drafter.block_logits(block, positions, context, mask))
    assert "tensorrt_llm" not in sys.modules


@pytest.mark.parametrize("kind", ["depth_causal", "autoregressive"])
@pytest.mark.parametrize("route", ["auto", "dflash"])
def test_dflash_route_refuses_other_variants(pairs, tmp_path, kind, route):
    target, drafter = load(pairs, kind)
    with pytest.raises(SpecError, match=f"variant='{kind}' cannot be expressed.*--route onnx"):
        export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.3.0", route=route))
    assert_no_output(tmp_path / "out")


def test_dflash_weights_refuse_shift_mix(pairs):
    """Second line of defence: a depth_causal state dict has weights no DFlash checkpoint can hold."""
    _, drafter = load(pairs, "depth_causal")
    with pytest.raises(SpecError, match="shift_mix"):
        dflash_weights(drafter, torch.float32)


def test_trtllm_1_2_has_no_dflash(pairs, tmp_path):
    target, drafter = load(pairs, "parallel")
    with pytest.raises(SpecError, match="1.2.1 has no DFlash mode"):
        export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.2.1"))
    assert_no_output(tmp_path / "out")


@pytest.mark.parametrize("kind", VARIANT_KINDS)
def test_onnx_route(pairs, tmp_path, kind):
    """Any variant, any version: the TensorRT-builder graph runs in onnxruntime like the torch drafter."""
    target, drafter = load(pairs, kind)
    request = ExportRequest("1.2.1", route="onnx", max_batch=4, max_context=256)
    out = export_for_trtllm(target, drafter, tmp_path / "out", request)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["route"] == "onnx" and manifest["speculative_config"] is None
    assert manifest["build"]["profile"]["features"] == [[1, 1, 128], [1, 256, 128], [4, 256, 128]]
    assert "--maxShapes=features:4x256x128," in manifest["build"]["trtexec"]
    graph = OnnxDrafterGraph(out, target)
    generator = torch.Generator().manual_seed(3)
    features = torch.randn(4, 11, 128, generator=generator)
    positions = torch.arange(11).expand(4, -1)
    valid = torch.rand(4, 11, generator=generator) > 0.2
    block = torch.randint(0, 255, (4, 1, 8), generator=generator)
    block_positions = (11 + torch.arange(8)).expand(4, 1, 8)
    with torch.no_grad():
        expected = drafter.block_logits(block, block_positions, drafter.context_kv(features, positions),
                                        valid[:, None, :].expand(-1, 8, -1))
    error = (graph.block_logits(features, positions, valid, block, block_positions) - expected).abs().max().item()
    assert error <= TOLERANCE


@pytest.mark.parametrize("request_, block_size, match", [
    (ExportRequest("1.3.0", route="tensorrt"), None, "route='tensorrt' is unknown"),
    (ExportRequest("latest"), None, "trtllm_version='latest' is not a version"),
    (ExportRequest("1.3.0", dtype="int8"), None, "dtype='int8' is unknown"),
    (ExportRequest("1.3.0", num_draft_tokens=8), None, "num_draft_tokens=8 does not fit block_size=8"),
    (ExportRequest("1.2.1", route="onnx", opset=24), None, "opset=24 is not supported"),
    (ExportRequest("1.3.0"), "dynamic", "dynamic block size cannot be exported"),
    (ExportRequest("1.3.0"), 16, "block_size=16 differs from the checkpoint's block_size=8"),
])
def test_bad_requests_leave_nothing(pairs, tmp_path, request_, block_size, match):
    target_dir, drafter_dir = pairs["parallel"]
    with pytest.raises(SpecError, match=match):
        export_trtllm(drafter_dir, target_dir, tmp_path / "out", request_, block_size)
    assert_no_output(tmp_path / "out")


def test_cli_export_trtllm(pairs, tmp_path, capsys):
    target_dir, drafter_dir = pairs["depth_causal"]
    args = ["export", "trtllm", str(drafter_dir), str(tmp_path / "out"), "--target", str(target_dir)]
    assert main(args + ["--trtllm-version", "1.3.0rc27"]) == 2
    assert "--route onnx" in capsys.readouterr().err
    assert_no_output(tmp_path / "out")
    target_dir, drafter_dir = pairs["parallel"]
    args = ["export", "trtllm", str(drafter_dir), str(tmp_path / "out"), "--target", str(target_dir)]
    assert main(args + ["--trtllm-version", "1.3.0rc27", "--num-draft-tokens", "4"]) == 0
    assert '"max_draft_len": 4' in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "out").iterdir()} == {DRAFT_DIR, MANIFEST_FILE, LLM_API_OPTIONS_FILE,
                                                          OUTPUT_MARKER}
