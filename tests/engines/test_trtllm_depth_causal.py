"""depth_causal inside TensorRT-LLM's DFlash mode, checked here without TensorRT-LLM.

The adapter's forward logic (portable_spec/adapters/tensorrt_llm/depth_causal.py) is pure torch; it runs on a CPU
twin of TensorRT-LLM's DFlash layer loop (trtllm_dflash_twin.py) loaded from what `portable-spec export trtllm`
wrote. The twin is first shown faithful on `parallel` (TensorRT-LLM's own drafter); then the mixin on the twin must
reproduce the core depth_causal drafter's logits, and each half of it (causal mask, shift-mix) must matter.
Nothing here imports tensorrt_llm; the run inside TensorRT-LLM is scripts/gpu/trtllm_check.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trtllm_dflash_twin import TwinDFlash

from portable_spec.adapters.tensorrt_llm import DRAFT_DIR, MODULE_DIR, ExportRequest, export_for_trtllm
from portable_spec.adapters.tensorrt_llm.depth_causal import DepthCausalDFlashMixin, split_shift_mix_weights
from portable_spec.adapters.tensorrt_llm.plugin import needs_plugin, portable_variant
from portable_spec.core.spec import SpecError
from portable_spec.core.testing import tiny_drafter, tiny_target

TOLERANCE = 1e-4
CONTEXT_LENGTHS = (5, 9)  # two requests of different lengths in one pooled cache


class TwinDepthCausal(DepthCausalDFlashMixin, TwinDFlash):
    """The twin with the mixin, built exactly as plugin.PortableDepthCausalDFlash builds TensorRT-LLM's class."""

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.install_depth_causal(config["hidden_size"])


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def exported(target, kind: str, out: Path) -> tuple[dict, dict, object]:
    drafter = tiny_drafter(target, kind)
    export_for_trtllm(target, drafter, out, ExportRequest("1.4.0", dtype="float32"))
    config = json.loads((out / DRAFT_DIR / "config.json").read_text())
    return config, load_file(out / DRAFT_DIR / "model.safetensors"), drafter


def twin_block_logits(twin: TwinDFlash, target, drafter, features, block_ids):
    """What TensorRT-LLM's DFlash worker computes for one round: projected context K/V in a pooled cache (request b
    in slot 1 - b, to exercise cache_batch_idx), [anchor; MASK...] embedded, dflash_forward, the target's LM head."""
    batch, block = block_ids.shape
    layers, kv_heads, head_dim = len(twin.model.layers), drafter.config.num_key_value_heads, drafter.config.head_dim
    pool_k = torch.zeros(batch, layers, max(CONTEXT_LENGTHS) + block, kv_heads, head_dim)
    pool_v = torch.zeros_like(pool_k)
    slots = torch.arange(batch - 1, -1, -1)
    for b, length in enumerate(CONTEXT_LENGTHS):
        k, v = twin.precompute_context_kv(twin.project_target_hidden(features[b, :length]), torch.arange(length))
        pool_k[slots[b], :, :length] = k.transpose(0, 1)
        pool_v[slots[b], :, :length] = v.transpose(0, 1)
    lengths = torch.tensor(CONTEXT_LENGTHS)
    positions = lengths[:, None] + torch.arange(block)
    hidden = twin.dflash_forward(
        target.shared_modules().embed_tokens(block_ids), positions, lengths, pool_k, pool_v, slots
    )
    return target.shared_modules().lm_head(hidden).view(batch, block, -1)


def core_block_logits(drafter, features, block_ids):
    """The core drafter on the same round: context = each request's own features, block right after them."""
    batch, block = block_ids.shape
    width = max(CONTEXT_LENGTHS)
    valid = torch.arange(width)[None, :] < torch.tensor(CONTEXT_LENGTHS)[:, None]
    context = drafter.context_kv(features[:, :width], torch.arange(width).expand(batch, -1))
    positions = torch.tensor(CONTEXT_LENGTHS)[:, None, None] + torch.arange(block)
    return drafter.block_logits(block_ids[:, None], positions, context, valid[:, None].expand(-1, block, -1))[:, 0]


def round_inputs(target, drafter):
    torch.manual_seed(3)
    features = torch.randn(len(CONTEXT_LENGTHS), max(CONTEXT_LENGTHS), drafter.config.feature_size)
    block = torch.full((len(CONTEXT_LENGTHS), drafter.config.block_size), drafter.config.mask_token_id)
    block[:, 0] = torch.tensor([7, 11])  # the anchors
    return features, block


def run_twin(twin_class, config, weights, target, drafter):
    twin = twin_class(config)
    twin.load_weights(weights)
    features, block = round_inputs(target, drafter)
    with torch.no_grad():
        return twin_block_logits(twin, target, drafter, features, block), core_block_logits(drafter, features, block)


def test_twin_reproduces_parallel_which_tensorrt_llm_runs_natively(target, tmp_path):
    config, weights, drafter = exported(target, "parallel", tmp_path / "out")
    assert portable_variant(type("C", (), {"portable_spec": config["portable_spec"]})) == "parallel"
    twin, core = run_twin(TwinDFlash, config, weights, target, drafter)
    assert (twin - core).abs().max() <= TOLERANCE


def test_mixin_reproduces_core_depth_causal(target, tmp_path):
    config, weights, drafter = exported(target, "depth_causal", tmp_path / "out")
    twin, core = run_twin(TwinDepthCausal, config, weights, target, drafter)
    assert (twin - core).abs().max() <= TOLERANCE
    assert torch.equal(twin.argmax(-1), core.argmax(-1))


def test_each_half_of_the_mixin_matters(target, tmp_path, monkeypatch):
    """TensorRT-LLM's own DFlash class on a depth_causal checkpoint (shift-mix weights dropped) is wrong, and so is
    the mixin without the causal mask: both differences are needed, so neither test above passes by accident."""
    config, weights, drafter = exported(target, "depth_causal", tmp_path / "out")
    plain, _ = split_shift_mix_weights(weights, config["num_hidden_layers"], "test")
    stock, core = run_twin(TwinDFlash, config, plain, target, drafter)
    assert (stock - core).abs().max() > 100 * TOLERANCE
    monkeypatch.setattr(TwinDepthCausal, "_get_attention_mask_args", TwinDFlash._get_attention_mask_args)
    bidirectional, core = run_twin(TwinDepthCausal, config, weights, target, drafter)
    assert (bidirectional - core).abs().max() > 100 * TOLERANCE


def test_causal_block_is_exact_when_cut(target, tmp_path):
    """Causal in the block: slot j's logits do not depend on later slots, so TensorRT-LLM may run a shorter block."""
    config, weights, drafter = exported(target, "depth_causal", tmp_path / "out")
    twin = TwinDepthCausal(config)
    twin.load_weights(weights)
    features, block = round_inputs(target, drafter)
    with torch.no_grad():
        full = twin_block_logits(twin, target, drafter, features, block)
        cut = twin_block_logits(twin, target, drafter, features, block[:, :3])
    assert (full[:, :3] - cut).abs().max() <= TOLERANCE


def test_weight_names_and_config_for_the_plugin(target, tmp_path):
    config, weights, drafter = exported(target, "depth_causal", tmp_path / "out")
    layers = config["num_hidden_layers"]
    assert {f"layers.{i}.shift_mix.weight" for i in range(layers)} <= set(weights)
    rest, mixes = split_shift_mix_weights(weights, layers, "test")
    assert sorted(mixes) == list(range(layers)) and not any("shift_mix" in name for name in rest)
    for index, weight in mixes.items():
        assert torch.equal(weight, drafter.layers[index].shift_mix.weight.detach())
    assert config["portable_spec"]["variant"] == "depth_causal" and config["is_causal"] is True
    assert needs_plugin(type("C", (), {"portable_spec": config["portable_spec"]}))
    assert not needs_plugin(type("C", (), {"portable_spec": {"variant": "parallel"}}))
    assert not needs_plugin(type("C", (), {}))  # a plain DFlash checkpoint keeps TensorRT-LLM's class
    module = tmp_path / "out" / MODULE_DIR / "__init__.py"
    assert "register()" in module.read_text()
    manifest = json.loads((tmp_path / "out" / "trtllm.json").read_text())
    assert f"--custom_module_dirs {module.parent.resolve()}" in manifest["build"]["serve"]


def test_missing_shift_mix_weights_are_refused(target, tmp_path):
    config, weights, _ = exported(target, "depth_causal", tmp_path / "out")
    weights.pop("layers.1.shift_mix.weight")
    with pytest.raises(SpecError, match=r"layers\.\{0\.\.1\}\.shift_mix\.weight, found layers \[0\]"):
        TwinDepthCausal(config).load_weights(weights)


def test_plugin_refuses_a_tensorrt_llm_without_the_registry(tmp_path):
    """An installed TensorRT-LLM that predates the draft-model registry (here a bare package standing in for 1.2.1;
    only our refusal is under test): register() names the version, what is needed and the ONNX fallback."""
    package = tmp_path / "site" / "tensorrt_llm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "1.2.1"\n')
    script = textwrap.dedent("""
        import sys
        from portable_spec.adapters.tensorrt_llm.plugin import register
        from portable_spec.core.spec import SpecError
        try:
            register()
        except SpecError as error:
            print(error)
        else:
            sys.exit("register() did not refuse")
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "tensorrt_llm 1.2.1 has no" in result.stdout
        and "register_draft_model" in result.stdout
        and ">= 1.4" in result.stdout
        and "--route onnx" in result.stdout
    )
