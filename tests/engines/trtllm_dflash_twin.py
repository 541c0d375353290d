"""A CPU twin of TensorRT-LLM's DFlash draft model, for checking portable-spec's depth_causal mixin without a GPU.

Not TensorRT-LLM and not tested as such: it mirrors, in plain torch, the parts of
`tensorrt_llm/_torch/models/modeling_dflash.py` (NVIDIA/TensorRT-LLM, read at commit
009d8fa431bd3de92245aab80f8b57dc70da1ac4) that the mixin relies on, line for line where it matters:

* `RMSNorm.forward(hidden, residual=...)` of `_torch/modules/rms_norm.py` (torch path): with a residual it adds in
  float32, returns (normed, sum); without, returns normed;
* `load_weights`: `fc.weight` / `hidden_norm.weight` taken directly, `norm.weight` -> `model.norm.weight`, the rest
  under `model.`; fused `qkv_proj` and `gate_up_proj` filled from the split HF names (the model loader's job);
  names it does not know are an error here, so anything the mixin should have taken is caught;
* `precompute_context_kv`: context K/V from fc + hidden_norm'd target features, no input norm, k_norm, RoPE;
* `dflash_forward` (VANILLA backend, pure-torch RoPE path): layer 0 `residual = hidden.clone()` and a plain
  `input_layernorm(hidden)`, later layers `input_layernorm(hidden, residual)`, q/k norm + RoPE on the block,
  `flash_attn_with_kvcache` appending the block's K/V at `cache_seqlens` with `causal` from
  `_get_attention_mask_args`, `post_attention_layernorm(out, residual)`, MLP, final `norm(hidden, residual)`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from portable_spec.core.drafter_layers import apply_rotary, rotary_cos_sin


class TwinRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states, residual=...):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        if isinstance(residual, torch.Tensor):
            hidden_states = hidden_states + residual.to(torch.float32)
            residual = hidden_states.to(input_dtype)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        hidden_states = self.weight * hidden_states.to(input_dtype)
        return hidden_states if residual is ... else (hidden_states, residual)


class TwinAttention(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.head_dim, self.num_heads = config["head_dim"], config["num_attention_heads"]
        self.num_key_value_heads = config["num_key_value_heads"]
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        hidden = config["hidden_size"]
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False)
        self.q_norm = TwinRMSNorm(self.head_dim, config["rms_norm_eps"])
        self.k_norm = TwinRMSNorm(self.head_dim, config["rms_norm_eps"])


class TwinMLP(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.intermediate = config["intermediate_size"]
        self.gate_up_proj = nn.Linear(config["hidden_size"], 2 * self.intermediate, bias=False)
        self.down_proj = nn.Linear(self.intermediate, config["hidden_size"], bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class TwinLayer(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.input_layernorm = TwinRMSNorm(config["hidden_size"], config["rms_norm_eps"])
        self.self_attn = TwinAttention(config)
        self.post_attention_layernorm = TwinRMSNorm(config["hidden_size"], config["rms_norm_eps"])
        self.mlp = TwinMLP(config)


class TwinBackbone(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TwinLayer(config) for _ in range(config["num_hidden_layers"]))
        self.norm = TwinRMSNorm(config["hidden_size"], config["rms_norm_eps"])


def flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, causal, window_size):
    """flash-attn's kvcache semantics: write k/v at cache_seqlens[b] of slot cache_batch_idx[b], attend to the first
    cache_seqlens[b] + q_len keys; causal aligns bottom-right (query i sees keys < cache_seqlens[b] + i + 1).
    q [B, Q, Hq, d]; k_cache/v_cache [pool, max_len, Hkv, d]; k/v [B, Q, Hkv, d] -> [B, Q, Hq, d]."""
    assert window_size == (-1, -1), "the twin implements no sliding window"
    outputs = []
    for b in range(q.shape[0]):
        slot, length, q_len = int(cache_batch_idx[b]), int(cache_seqlens[b]), q.shape[1]
        k_cache[slot, length : length + q_len] = k[b]
        v_cache[slot, length : length + q_len] = v[b]
        keys, values = k_cache[slot, : length + q_len], v_cache[slot, : length + q_len]  # [K, Hkv, d]
        groups = q.shape[2] // keys.shape[1]
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[b].float(), keys.float()) * q.shape[-1] ** -0.5
        if causal:
            visible = torch.arange(length + q_len)[None, :] <= (length + torch.arange(q_len))[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
        outputs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), values.float()).to(q.dtype))
    return torch.stack(outputs)


class TwinDFlash(nn.Module):
    """The DFlash draft model's block decode and weight loading (no TensorRT-LLM types, CPU, one dtype)."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config_dict = config
        self.model = TwinBackbone(config)
        self.fc: nn.Linear | None = None
        self.hidden_norm: TwinRMSNorm | None = None
        self.rope_theta = config["rope_theta"]

    # -- weights (DFlashForCausalLM.load_weights + the model loader's q/k/v and gate/up fusion) -----------------
    def load_weights(self, weights: dict, weight_mapper=None, **kwargs) -> None:
        weights = dict(weights)
        fc = weights.pop("fc.weight")
        self.fc = nn.Linear(fc.shape[1], fc.shape[0], bias=False)
        self.fc.weight.data.copy_(fc)
        norm = weights.pop("hidden_norm.weight")
        self.hidden_norm = TwinRMSNorm(norm.shape[0], self.config_dict["rms_norm_eps"])
        self.hidden_norm.weight.data.copy_(norm)
        remapped = {("model.norm.weight" if k == "norm.weight" else f"model.{k}"): v for k, v in weights.items()}
        params = dict(self.named_parameters())
        for index in range(len(self.model.layers)):
            prefix = f"model.layers.{index}."
            qkv = [remapped.pop(prefix + f"self_attn.{n}_proj.weight") for n in "qkv"]
            params[prefix + "self_attn.qkv_proj.weight"].data.copy_(torch.cat(qkv))
            gate_up = [remapped.pop(prefix + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
            params[prefix + "mlp.gate_up_proj.weight"].data.copy_(torch.cat(gate_up))
        unknown = sorted(set(remapped) - set(params))
        if unknown:
            raise KeyError(f"weights the DFlash loader does not know: {unknown}")
        for name, value in remapped.items():
            params[name].data.copy_(value)

    # -- context -------------------------------------------------------------------------------------------
    def project_target_hidden(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(hidden_states.to(self.fc.weight.dtype)))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [N, heads, d] at positions [N] (NeoX half rotation, as RotaryEmbedding.apply_rotary_pos_emb)."""
        cos, sin = rotary_cos_sin(positions[None], x.shape[-1], self.rope_theta, x.dtype)  # [1, 1, N, d]
        return apply_rotary(x.transpose(0, 1)[None], cos, sin)[0].transpose(0, 1)

    def precompute_context_kv(self, projected: torch.Tensor, positions: torch.Tensor):
        """projected [N, H] -> k, v [N, L, Hkv, d] (k normed and rotated)."""
        ks, vs = [], []
        for layer in self.model.layers:
            attn = layer.self_attn
            kv = F.linear(projected, attn.qkv_proj.weight[attn.q_size :])
            k = attn.k_norm(kv[:, : attn.kv_size].view(-1, attn.num_key_value_heads, attn.head_dim))
            ks.append(self._rope(k, positions))
            vs.append(kv[:, attn.kv_size :].view(-1, attn.num_key_value_heads, attn.head_dim))
        return torch.stack(ks, dim=1), torch.stack(vs, dim=1)

    # -- block ---------------------------------------------------------------------------------------------
    def _get_attention_mask_args(self, layer_idx: int):
        return False, (-1, -1)  # no sliding-window layers: DFlash's bidirectional block

    def dflash_forward(
        self, noise_embedding, query_positions, num_ctx_per_req, ctx_k_cache, ctx_v_cache, ctx_cache_batch_idx
    ):
        """noise_embedding [B, k, H]; ctx caches [pool, L, max_len, Hkv, d] -> [B*k, H] after the final norm."""
        batch, block = noise_embedding.shape[:2]
        hidden_states, residual = noise_embedding, None
        positions = query_positions.reshape(-1)
        for layer_idx, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            hs_flat = hidden_states.reshape(-1, hidden_states.shape[-1])
            if residual is None:
                residual = hidden_states.clone()
                hs_normed_flat = layer.input_layernorm(hs_flat)
            else:
                hs_normed_flat, res_flat = layer.input_layernorm(hs_flat, residual.reshape(-1, residual.shape[-1]))
                residual = res_flat.reshape(batch, block, -1)
            qkv = attn.qkv_proj(hs_normed_flat)
            q = attn.q_norm(qkv[:, : attn.q_size].reshape(-1, attn.num_heads, attn.head_dim))
            k = attn.k_norm(
                qkv[:, attn.q_size : attn.q_size + attn.kv_size].reshape(-1, attn.num_key_value_heads, attn.head_dim)
            )
            v = qkv[:, attn.q_size + attn.kv_size :].reshape(batch, block, attn.num_key_value_heads, attn.head_dim)
            q = self._rope(q, positions).reshape(batch, block, attn.num_heads, attn.head_dim)
            k = self._rope(k, positions).reshape(batch, block, attn.num_key_value_heads, attn.head_dim)
            causal, window_size = self._get_attention_mask_args(layer_idx)
            out = flash_attn_with_kvcache(
                q,
                ctx_k_cache[:, layer_idx],
                ctx_v_cache[:, layer_idx],
                k,
                v,
                num_ctx_per_req,
                ctx_cache_batch_idx,
                causal,
                window_size,
            )
            hidden_out = attn.o_proj(out.reshape(batch * block, attn.q_size))
            hidden_out, res_flat = layer.post_attention_layernorm(hidden_out, residual.reshape(-1, residual.shape[-1]))
            hidden_states = layer.mlp(hidden_out).reshape(batch, block, -1)
            residual = res_flat.reshape(batch, block, -1)
        hidden_states_out, _ = self.model.norm(
            hidden_states.reshape(-1, hidden_states.shape[-1]), residual.reshape(-1, residual.shape[-1])
        )
        return hidden_states_out
