"""TensorRT-LLM export routes without TensorRT-LLM (never imported here): files, configs, weights, graph numerics.

dflash route: parallel drafters for TensorRT-LLM >= 1.3 -> DFlash HF checkpoint + DFlashDecodingConfig.
onnx route: any variant/version -> TensorRT-builder graph, checked in onnxruntime (max abs error <= 1e-4).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Literal, Optional, Union

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt
from safetensors.torch import load_file

from portable_spec.core.outputs import OUTPUT_MARKER

pytest.importorskip("onnxruntime")

from portable_spec.adapters.onnx import OnnxBackend, OnnxDrafterGraph  # noqa: E402
from portable_spec.adapters.tensorrt_llm import (  # noqa: E402
    DRAFT_DIR,
    LLM_API_OPTIONS_FILE,
    MANIFEST_FILE,
    MODULE_DIR,
    DFlashSpeculativeConfig,
    ExportRequest,
    dflash_weights,
    export_for_trtllm,
    export_trtllm,
    validate_speculative_config,
)
from portable_spec.cli import main  # noqa: E402
from portable_spec.core.drafter import Drafter  # noqa: E402
from portable_spec.core.spec import VARIANT_KINDS, SpecError  # noqa: E402
from portable_spec.core.target import (
    TargetModel,  # noqa: E402
    drafter_config_for,  # noqa: E402
)
from portable_spec.core.testing import save_tiny_pair  # noqa: E402

TOLERANCE = 1e-4


# DFlashDecodingConfig as TensorRT-LLM's source defines it: tensorrt_llm/llmapi/llm_args.py at NVIDIA/TensorRT-LLM
# commit 0004396720054fd8e205cbf616f21f0b57c6b412 (DecodingBaseConfig's fields + DFlash's own four; the same names as
# the 1.3.0rc27 API reference). Types as declared there (validators that only fill defaults left out).
class SourceDFlashDecodingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    max_draft_len: Optional[NonNegativeInt] = None
    max_total_draft_tokens: Optional[int] = None
    speculative_model: Optional[Union[str, Path]] = None
    max_concurrency: Optional[PositiveInt] = None
    draft_len_schedule: Optional[dict[int, int]] = None
    load_format: Optional[str] = None
    acceptance_rate_window_size: Optional[NonNegativeInt] = None
    acceptance_rate_threshold: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    use_rejection_sampling: bool = False
    allow_advanced_sampling: bool = False
    advanced_sampling_mode: Literal["full", "no_topk", "no_topp", "no_topk_no_topp"] = "full"
    enable_penalty: bool = False
    mask_token_id: Optional[int] = None
    target_layer_ids: Optional[List[int]] = None
    decoding_type: Literal["DFlash"] = "DFlash"
    attention_backend: Literal["VANILLA", "TRTLLM"] = "VANILLA"


DFLASH_DECODING_CONFIG_FIELDS = set(SourceDFlashDecodingConfig.model_fields)


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
    SourceDFlashDecodingConfig.model_validate(spec)  # names and types as TensorRT-LLM's source declares them
    assert validate_speculative_config(spec) == DFlashSpeculativeConfig(
        max_draft_len=7,
        speculative_model=str((tmp_path / "out" / DRAFT_DIR).resolve()),
        mask_token_id=255,
        target_layer_ids=[0, 1],
    )
    assert Path(spec["speculative_model"]).is_dir()  # points at the final dir, not the temp one

    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load((out / LLM_API_OPTIONS_FILE).read_text()) == {"speculative_config": spec}

    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(out / DRAFT_DIR)  # a valid HF config: what TRT-LLM's loader parses
    assert hf.model_type == "qwen3" and hf.architectures == ["DFlashDraftModel"]
    assert hf.dflash_config == {
        "mask_token_id": 255,
        "target_layer_ids": [0, 1],
        "block_size": 8,
        "num_target_layers": 3,
    }
    assert hf.block_size == 8 and hf.num_hidden_layers == 2 and hf.head_dim == 32

    # Weights round-trip: same names, shapes and values (exact in float32, exactly rounded in bfloat16).
    weights = load_file(str(out / DRAFT_DIR / "model.safetensors"))
    original = drafter.state_dict()
    assert set(weights) == set(original)
    for name, tensor in weights.items():
        assert tensor.dtype == getattr(torch, dtype)
        assert torch.equal(tensor, original[name].to(tensor.dtype)), name
    if dtype == "float32":  # rebuilt from the converted files, the drafter computes the same logits
        rebuilt = target.bind(Drafter(drafter.config))
        rebuilt.load_state_dict(weights)
        context = drafter.context_kv(torch.randn(2, 6, 128), torch.arange(6).expand(2, -1))
        block = torch.randint(0, 255, (2, 1, 8))
        positions = (6 + torch.arange(8)).expand(2, 1, 8)
        mask = torch.ones(2, 8, 6, dtype=torch.bool)
        with torch.no_grad():
            assert torch.equal(
                rebuilt.eval().block_logits(block, positions, context, mask),
                drafter.block_logits(block, positions, context, mask),
            )
    assert "tensorrt_llm" not in sys.modules


@pytest.mark.parametrize("version", ["1.3.0", "1.4.0"])
@pytest.mark.parametrize("route", ["auto", "dflash"])
def test_dflash_route_refuses_autoregressive(pairs, tmp_path, version, route):
    target, drafter = load(pairs, "autoregressive")
    with pytest.raises(SpecError, match="variant='autoregressive' drafts one token per pass.*--route onnx"):
        export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest(version, route=route))
    assert_no_output(tmp_path / "out")


@pytest.mark.parametrize("route", ["auto", "dflash"])
def test_the_dflash_routes_refuse_dflash2(pairs, tmp_path, route):
    """Neither TensorRT-LLM's DFlash mode nor portable-spec's builder runs DFlash2's convolutions and candidate
    selector: refused by name, nothing written (the onnx route writes both of its graphs: test_onnx_route)."""
    target, drafter = load(pairs, "dflash2")
    with pytest.raises(SpecError, match="dflash2"):
        export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.4.0", route=route))
    assert_no_output(tmp_path / "out")


def test_dflash_route_depth_causal_needs_the_builder_registry(pairs, tmp_path):
    """depth_causal runs in DFlash mode only through plugin.py (TensorRT-LLM >= 1.4); 1.3 is refused, naming both."""
    target, drafter = load(pairs, "depth_causal")
    with pytest.raises(SpecError, match="needs TensorRT-LLM >= 1.4 .*found 1.3.0rc27.*--route onnx"):
        export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.3.0rc27"))
    assert_no_output(tmp_path / "out")
    out = export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.4.0", dtype="float32"))
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["route"] == "dflash" and manifest["variant"] == "depth_causal"
    SourceDFlashDecodingConfig.model_validate(manifest["speculative_config"])
    assert "register()" in manifest["build"]["llm_api"] and "--custom_module_dirs" in manifest["build"]["serve"]
    weights = load_file(str(out / DRAFT_DIR / "model.safetensors"))
    assert set(weights) == set(drafter.state_dict())  # shift-mix included, under the core's names


def test_dflash_weights_refuse_a_reduced_vocabulary(pairs):
    """DFlash in TensorRT-LLM scores with the target's full LM head; a draft-vocabulary drafter is refused by name."""
    target, _ = load(pairs, "parallel")
    config = drafter_config_for(
        target,
        kind="parallel",
        block_size=8,
        num_hidden_layers=1,
        target_layer_ids=[0, 1],
        mask_token_id=255,
        draft_vocab_size=16,
    )
    with pytest.raises(SpecError, match="draft_vocab_size=16: TensorRT-LLM"):
        dflash_weights(target.bind(Drafter(config)), torch.float32)


def test_trtllm_1_2_has_no_dflash(pairs, tmp_path):
    target, drafter = load(pairs, "parallel")
    with pytest.raises(SpecError, match="1.2.1 has no DFlash mode"):
        export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.2.1"))
    assert_no_output(tmp_path / "out")


@pytest.mark.parametrize("kind", OnnxBackend.kinds_supported)
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
        expected = drafter.block_logits(
            block, block_positions, drafter.context_kv(features, positions), valid[:, None, :].expand(-1, 8, -1)
        )
    error = (graph.block_logits(features, positions, valid, block, block_positions) - expected).abs().max().item()
    assert error <= TOLERANCE
    if drafter.behaviour.sequential_head:  # the head's step graph, with its own profile and build command
        step = manifest["build"]["head_step_profile"]
        assert step["hidden"] == [[1, 64], [1, 64], [4, 64]] and step["previous"] == [[1], [1], [4]]
        assert manifest["build"]["head_step_trtexec"].startswith("trtexec --onnx=head_step.onnx")
        assert (out / "head_step.onnx").exists() and graph.step_session is not None
    else:
        assert "head_step_profile" not in manifest["build"] and not (out / "head_step.onnx").exists()


@pytest.mark.parametrize(
    "request_, block_size, match",
    [
        (ExportRequest("1.3.0", route="tensorrt"), None, "route='tensorrt' is unknown"),
        (ExportRequest("latest"), None, "trtllm_version='latest' is not a version"),
        (ExportRequest("1.3.0", dtype="int8"), None, "dtype='int8' is unknown"),
        (ExportRequest("1.3.0", num_draft_tokens=8), None, "num_draft_tokens=8 does not fit block_size=8"),
        (ExportRequest("1.2.1", route="onnx", opset=24), None, "opset=24 is not supported"),
        (ExportRequest("1.3.0"), "dynamic", "dynamic block size cannot be exported"),
        (ExportRequest("1.3.0"), 16, "block_size=16 differs from the checkpoint's block_size=8"),
    ],
)
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
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        DRAFT_DIR,
        MANIFEST_FILE,
        LLM_API_OPTIONS_FILE,
        OUTPUT_MARKER,
    }
    assert main(args + ["--trtllm-version", "1.3.0rc27", "--num-draft-tokens", "0"]) == 2  # not silently 7
    assert "num_draft_tokens=0" in capsys.readouterr().err
    target_dir, drafter_dir = pairs["depth_causal"]
    args = ["export", "trtllm", str(drafter_dir), str(tmp_path / "dc"), "--target", str(target_dir)]
    assert main(args + ["--trtllm-version", "1.4.0"]) == 0
    printed = capsys.readouterr().out
    assert f"--custom_module_dirs {(tmp_path / 'dc' / MODULE_DIR).resolve()}" in printed and "register()" in printed


def test_dflash_route_with_sliding_windows(tmp_path):
    """A bidirectional parallel drafter with sliding layers exports with the keys TensorRT-LLM's modeling_dflash.py
    windows by (dflash_config use_swa + swa_window_size, layer_types); a causal block or a windowed depth_causal
    drafter is refused by name (TensorRT-LLM's generic DFlash block is bidirectional; the builder is not mirrored
    with windows)."""
    from transformers import AutoConfig

    from portable_spec.core.testing import tiny_drafter, tiny_target

    target = tiny_target()
    mixed = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=16)
    drafter = tiny_drafter(target, "parallel", **mixed)
    out = export_for_trtllm(target, drafter, tmp_path / "out", ExportRequest("1.3.0rc27", dtype="float32"))
    hf = AutoConfig.from_pretrained(out / DRAFT_DIR)
    assert hf.layer_types == mixed["layer_types"] and hf.sliding_window == 16 and hf.is_causal is False
    assert hf.dflash_config["use_swa"] is True and hf.dflash_config["swa_window_size"] == 16
    refused = {
        "causal": (tiny_drafter(target, "parallel", block_attention="causal", **mixed), "1.3.0rc27"),
        "depth_causal": (tiny_drafter(target, "depth_causal", **mixed), "1.4.0"),
    }
    patterns = {
        "causal": "block_attention=causal: TensorRT-LLM's DFlash drafter runs the block bidirectionally",
        "depth_causal": "windowed depth_causal drafters are not exported",
    }
    for name, (refused_drafter, version) in refused.items():
        with pytest.raises(SpecError, match=patterns[name]):
            export_for_trtllm(target, refused_drafter, tmp_path / name, ExportRequest(version))
        assert_no_output(tmp_path / name)
        onnx = export_for_trtllm(
            target, refused_drafter, tmp_path / f"{name}-onnx", ExportRequest(version, route="onnx")
        )
        assert json.loads((onnx / MANIFEST_FILE).read_text())["route"] == "onnx"  # the ONNX route carries windows
