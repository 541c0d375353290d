"""Run SGLang's draft model classes on a CPU, outside the engine, the way DFlashWorkerV2 drives them.

For tests and debugging only (SGLang's engine refuses DFLASH on CPU, see docs/backends/sglang.md). Real SGLang
pieces: the model loader, the draft model, the KV pool (MHATokenToKVPool), the context-KV write of
`DFlashWorkerV2._append_target_hidden_sequential`, the TARGET_VERIFY draft batch and the torch-native attention
backend (standing in for the CUDA backends, which honour the same causal / ENCODER_ONLY split).
Not real: the scheduler, the worker itself, CUDA graphs. Import order: call `init_sglang_cpu()` first.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch


def init_sglang_cpu(master_port: int = 29632) -> None:
    """Single-process model-parallel groups on gloo + a published CPU ServerArgs (what layer_ut_utils does,
    without importing sglang.test, which needs `datasets`). Idempotent."""
    for key, value in (
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", str(master_port)),
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
    ):
        os.environ.setdefault(key, value)
    shim_vllm_rotary()
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    if not torch.distributed.is_initialized():
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    if not model_parallel_is_initialized():
        reset_context()
        args = ServerArgs(model_path="dummy", device="cpu", tp_size=1, ep_size=1, pp_size=1)
        publish(args, role="test", ranks=SpawnRanks(world_rank=0))
        if parallel_state._WORLD is not None:
            get_parallel().override_permanently(world_group=parallel_state._WORLD)
        initialize_model_parallel(backend="gloo")


def shim_vllm_rotary() -> None:
    """sglang 0.5.23 RotaryEmbedding.__init__ imports `vllm._custom_ops.rotary_embedding` on a platform that is
    neither CUDA nor the sgl-kernel CPU engine; only forward_cuda uses it. An in-process stand-in that raises
    if called lets the CPU path (forward_native) run; nothing is put on sys.path."""
    if "vllm._custom_ops" in sys.modules:
        return
    package = types.ModuleType("vllm")
    package.__path__ = []
    package.__spec__ = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    ops = types.ModuleType("vllm._custom_ops")
    ops.__spec__ = importlib.machinery.ModuleSpec("vllm._custom_ops", None)

    def rotary_embedding(*args, **kwargs):
        raise RuntimeError("vllm rotary kernel stand-in called: the CPU path should use forward_native")

    ops.rotary_embedding = rotary_embedding
    package._custom_ops = ops
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = package, ops


def load_with_sglang(model_dir: Path, *, is_draft_model: bool, dtype: str = "float32"):
    """(model, sglang ModelConfig) built by SGLang's real loader from an HF-style directory."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import get_model

    model_config = ModelConfig(model_path=str(model_dir), dtype=dtype, is_draft_model=is_draft_model)
    model = get_model(
        model_config=model_config, load_config=LoadConfig(load_format="auto"), device_config=DeviceConfig(device="cpu")
    )
    return model.eval(), model_config


@dataclass
class DraftBlocks:
    """One draft block per request, as DFlashWorkerV2 builds it."""

    context_features: list[torch.Tensor]  # per request [T_b, len(target_layer_ids) * H] at positions 0..T_b-1
    block_embeds: torch.Tensor  # [B, k, H]: target embedding of [anchor, MASK...]
    block_positions: torch.Tensor  # [B, k]: T_b + arange(k)


@torch.no_grad()
def draft_block_hidden(model, blocks: DraftBlocks) -> torch.Tensor:  # [B, k, H] after the draft's final norm
    """Context K/V into a real KV pool, then one TARGET_VERIFY draft forward with the torch-native backend."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context

    batch, k, hidden = blocks.block_embeds.shape
    context_lens = torch.tensor([f.shape[0] for f in blocks.context_features])
    attn = model.layers[0].self_attn
    dtype = model.fc.weight.dtype
    total = int(context_lens.sum()) + batch * k
    pool = MHATokenToKVPool(
        size=total,
        page_size=1,
        dtype=dtype,
        head_num=attn.num_kv_heads,
        head_dim=attn.head_dim,
        layer_num=len(model.layers),
        device="cpu",
        enable_memory_saver=False,
    )
    req_to_token = torch.zeros(batch, int(context_lens.max()) + k, dtype=torch.int32)
    slots = iter(range(1, total + 1))  # slot 0 is the pool's padding slot
    for b, length in enumerate(context_lens.tolist()):
        req_to_token[b, : length + k] = torch.tensor([next(slots) for _ in range(length + k)], dtype=torch.int32)
    context_loc = torch.cat([req_to_token[b, :n] for b, n in enumerate(context_lens.tolist())]).long()
    block_loc = torch.cat([req_to_token[b, n : n + k] for b, n in enumerate(context_lens.tolist())]).long()

    # DFlashWorkerV2._append_target_hidden_sequential, verbatim in substance
    context_hidden = model.project_target_hidden(torch.cat(blocks.context_features).to(dtype))
    context_positions = torch.cat([torch.arange(n) for n in context_lens.tolist()])
    for layer in model.layers:
        layer_attn = layer.self_attn
        key, value = layer_attn.kv_proj_only(model.prepare_context_hidden_for_kv(layer, context_hidden))
        key = layer_attn.apply_k_rope(context_positions, layer_attn.apply_k_norm(key))
        pool.set_kv_buffer(
            layer_attn.attn,
            KVWriteLoc(context_loc, physical=True),
            key.view(-1, layer_attn.num_kv_heads, layer_attn.head_dim),
            value.view(-1, layer_attn.num_kv_heads, layer_attn.head_dim),
            layer_attn.attn.k_scale,
            layer_attn.attn.v_scale,
        )

    runner = types.SimpleNamespace(
        device="cpu", req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token), token_to_kv_pool=pool
    )
    backend = TorchNativeAttnBackend(runner)
    forward_batch = types.SimpleNamespace(  # the fields of the worker's draft ForwardBatch this backend reads
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=batch,
        out_cache_loc=block_loc,
        req_pool_indices=torch.arange(batch),
        seq_lens=context_lens + k,
        extend_prefix_lens=context_lens,
        extend_seq_lens=torch.full((batch,), k),
        encoder_lens=None,
        global_num_token_non_padded_cpu=batch * k,
        mha_return_lse=False,
    )
    backend.init_forward_metadata(forward_batch)
    set_forward_context(ForwardContext(attn_backend=backend))
    output = model(
        input_ids=torch.zeros(batch * k, dtype=torch.long),
        positions=blocks.block_positions.reshape(-1),
        forward_batch=forward_batch,
        input_embeds=blocks.block_embeds.reshape(-1, hidden).to(dtype),
    )
    return output.hidden_states.view(batch, k, hidden)
