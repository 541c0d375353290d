"""`portable-spec export gguf`: a portable drafter as the GGUF that llama.cpp's DFlash runtime loads
(`--spec-type draft-dflash`, `draft-dspark` for a DSpark; `src/models/dflash.cpp` at llama.cpp b11434), written with
the `gguf` package.

What llama.cpp reads (b11434: `llama_model_dflash::load_arch_hparams/load_arch_tensors`,
`common_speculative_impl_draft_dflash`), and where it comes from here:
- arch `dflash`, its Qwen3-style layer sizes, `dflash.block_size`, `dflash.attention.causal` (the block's
  attention), `dflash.target_layers` = the HF hidden_states indices (`target_layer_ids[i] + 1`: llama.cpp taps
  the *input* of that layer, i.e. the output of layer `target_layer_ids[i]`, as its own converter writes them);
  per-slot sliding windows as `attention.sliding_window` + `sliding_window_pattern`.
- the vocabulary: the `tokenizer.*` keys of the target GGUF the drafter runs beside, copied verbatim, so llama.cpp's
  draft/target vocabulary check (`common_speculative_are_compatible`) passes by construction; the drafter's
  `mask_token_id` as `tokenizer.ggml.mask_token_id` (the id of the noise block's slots).
- a draft vocabulary as `d2t` (int64, the target id of every draft row: llama.cpp scatters the draft logits to
  those ids, -inf elsewhere) with the drafter's *own* `output.weight` rows: the target's LM-head rows at those ids.
  llama.cpp's converter cannot map `d2t` for a DFlash drafter (`Can not map tensor 'model.d2t'`), which is why this
  writer exists. A full-vocabulary drafter without its own embeddings ships no head and uses the target's.

DFlash2 and DSpark (b11434 serves both natively): DFlash2's convolutions per layer and its candidate selector, with
`dflash.conv_kernel_size`, `conv_group_size`, `selector_rank`, `selector_top_k`; DSpark's Markov and confidence heads,
with `dflash.sample_from_anchor` and `has_confidence_head` (names as llama.cpp's own converter writes them from the
same checkpoint; what b11434's runtime lacks for some of their shapes: runtime_gap).

Refused by name: depth_causal (its shift-mix `h_j <- W [h_j ; h_{j-1}]` before every layer is a dense map of the
residual stream across slots; llama.cpp's DFlash graph has no such tensor, and DFlash2's convolution is per channel
group around sublayers, not the same function), autoregressive (one pass per draft token), windows per anchor
(llama.cpp windows per slot), YaRN with other than the default betas and scale (llama.cpp b11434 reads neither for
dflash), a drafter narrower or wider than its target (llama.cpp sizes `fc` from the drafter's width times the
tapped layers).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from portable_spec.adapters.llamacpp.build import BUILD
from portable_spec.core.checkpoint import load_drafter_files
from portable_spec.core.drafter import target_ids_of
from portable_spec.core.outputs import check_output_dir, write_dir_atomically
from portable_spec.core.spec import MAX_POSITION_EMBEDDINGS, DrafterConfig, SpecError
from portable_spec.core.target import TargetModel

KIND = "gguf-export"
DRAFTER_FILE = "draft.gguf"
MANIFEST_FILE = "portable_spec_gguf.json"
ARCH = "dflash"

# portable name -> llama.cpp tensor name (per layer: "layers.{i}." -> "blk.{i}.")
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_TENSORS = {
    "fc.weight": "fc.weight",
    "hidden_norm.weight": "enc.output_norm.weight",
    "norm.weight": "output_norm.weight",
    "embed_tokens.weight": "token_embd.weight",
    "lm_head.weight": "output.weight",
}
# DFlash2 (b11434 llama-arch.cpp LLM_TENSOR_DFLASH_*): the convolutions around each sublayer, the candidate selector
LAYER_TENSORS.update(
    {
        "attention_conv.base_kernel": "attn_conv_base",
        "attention_conv.kernel_projection.weight": "attn_conv_proj.weight",
        "mlp_conv.base_kernel": "ffn_conv_base",
        "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight",
    }
)
TOP_TENSORS.update(
    {
        "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
        "candidate_selector.successor_codebook": "selector_successor.weight",
        "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
        # DSpark (LLM_TENSOR_DSPARK_*): the Markov head and the confidence head
        "markov_head.markov_w1.weight": "markov_w1.weight",
        "markov_head.markov_w2.weight": "markov_w2.weight",
        "confidence_head.proj.weight": "conf_proj.weight",
        "confidence_head.proj.bias": "conf_proj.bias",
    }
)
SPEC_TYPES = {"parallel": "draft-dflash", "dflash2": "draft-dflash", "dspark": "draft-dspark"}  # --spec-type


def check_exportable(config: DrafterConfig, source: str) -> None:
    """Refuse, before anything loads, what llama.cpp's DFlash graph cannot compute as the reference does."""
    serve = "run it with `portable-spec generate` (reference, ONNX) or vLLM/SGLang through portable-spec's plugins"
    if config.kind == "depth_causal":
        raise SpecError(
            f"{source}: variant=depth_causal cannot be written for llama.cpp: its shift-mix h_j <- W [h_j ; h_{{j-1}}] "
            "before every layer is a dense map across block slots, and llama.cpp's DFlash graph (b11434 "
            "src/models/dflash.cpp) has none; DFlash2's 2-tap convolution is per channel group around each "
            "sublayer, another function. llama.cpp would need a per-layer [2H, H] slot-mix tensor applied before "
            f"attn_norm; {serve}"
        )
    if config.kind == "domino":
        raise SpecError(
            f"{source}: variant=domino cannot be written for llama.cpp: b11434 has no Domino head (its DFlash graph, "
            f"src/models/dflash.cpp, runs DFlash2's selector and DSpark's vanilla Markov head only); {serve}"
        )
    gap = runtime_gap(config)
    if gap is not None:
        if config.kind == "dflash2":  # the codebooks do not depend on top-k: a smaller one is the same checkpoint
            serve = f"lower variant.selector_top_k in config.json, or {serve}"
        raise SpecError(f"{source}: {gap}; {serve}")
    if config.kind not in SPEC_TYPES:
        raise SpecError(
            f"{source}: variant={config.kind} has no llama.cpp route: llama.cpp's draft-dflash runs one drafter pass "
            f"per round over [anchor, MASK...]; export a parallel drafter, or {serve}"
        )
    if config.has_windows and config.window_rule == "per_anchor":
        raise SpecError(
            f"{source}: window_rule=per_anchor (sliding_window {config.sliding_window}) cannot be written for "
            "llama.cpp: its sliding-window mask is per query slot (LLAMA_SWA_TYPE_STANDARD), so the drafter would "
            f"run as another function; {serve}"
        )
    yarn = config.rope_scaling
    if yarn is not None and (yarn.beta_fast, yarn.beta_slow, yarn.attention_factor) != (32.0, 1.0, None):
        raise SpecError(
            f"{source}: rope_scaling beta_fast={yarn.beta_fast}, beta_slow={yarn.beta_slow}, attention_factor="
            f"{yarn.attention_factor} cannot be written for llama.cpp: b11434 reads YaRN's betas only for some "
            "architectures (not dflash) and derives the cos/sin scale as 0.1 ln(factor) + 1, so only the defaults "
            f"(32, 1, None) run as trained; {serve}"
        )
    if config.hidden_size != config.target.hidden_size:
        raise SpecError(
            f"{source}: hidden_size={config.hidden_size} with a {config.target.hidden_size}-wide target cannot be "
            "written for llama.cpp: it sizes fc as len(target_layers) x the drafter's own width "
            f"(n_embd_inp_enc); {serve}"
        )


def runtime_gap(config: DrafterConfig) -> str | None:
    """Why b11434's runtime cannot compute this DFlash2 or DSpark drafter's function, or None: a shape it lacks, not
    a bad checkpoint (the llama.cpp backend reports it as a gap; `export gguf` refuses with it)."""
    variant = config.variant
    if config.kind == "dflash2":  # src/models/dflash.cpp build_dflash2_selector: one hidden-sized row per slot
        top_k = variant.selector_top_k
        if config.hidden_size < top_k * (top_k + 1):
            return (
                f"selector_top_k={top_k} needs hidden_size >= {top_k * (top_k + 1)} in llama.cpp (b11434 packs the "
                f"selector's top_k x (top_k + 1) lattice into one hidden-sized row), this drafter has "
                f"{config.hidden_size}"
            )
    if config.kind == "dspark":  # build_dspark_markov_head: W2 W1[prev]; conf_proj over [h ; W1[prev]]
        if variant.markov_head_type != "vanilla":
            return (
                f"markov_head_type={variant.markov_head_type}: llama.cpp b11434 runs the vanilla Markov head only "
                "(its converter refuses the others)"
            )
        if variant.confidence_head and not variant.confidence_head_with_markov:
            return (
                "confidence_head_with_markov=false: llama.cpp b11434's confidence head reads the slot's state and "
                "the previous token's Markov embedding (conf_proj is n_embd + rank wide)"
            )
    return None


def read_target_gguf(target_gguf: Path):
    """The target GGUF's reader, refused with one line when it is not a GGUF llama.cpp could load."""
    from gguf import GGUFReader

    if not target_gguf.is_file():
        raise SpecError(
            f"--target-gguf {target_gguf}: not a file; pass the GGUF of the target the drafter will run beside "
            "(llama.cpp's convert_hf_to_gguf.py writes one from an HF directory)"
        )
    try:
        return GGUFReader(str(target_gguf))
    except (ValueError, OSError) as error:
        raise SpecError(f"--target-gguf {target_gguf}: not a readable GGUF file ({error})") from None


def check_target_gguf(reader, config: DrafterConfig, target_gguf: Path) -> None:
    """The target GGUF must be the target the drafter is bound to: same width, depth and vocabulary."""
    fields = reader.fields
    arch = fields["general.architecture"].contents() if "general.architecture" in fields else None
    if arch is None or "tokenizer.ggml.tokens" not in fields:
        raise SpecError(
            f"--target-gguf {target_gguf}: no general.architecture or tokenizer.ggml.tokens; pass a model GGUF "
            "with its vocabulary (not a LoRA or vocab-less file)"
        )
    found = {
        "hidden_size": fields[f"{arch}.embedding_length"].contents() if f"{arch}.embedding_length" in fields else None,
        "num_hidden_layers": fields[f"{arch}.block_count"].contents() if f"{arch}.block_count" in fields else None,
        "vocab_size": len(fields["tokenizer.ggml.tokens"].data),
    }
    for name, value in found.items():
        expected = getattr(config.target, name)
        if value != expected:
            raise SpecError(
                f"--target-gguf {target_gguf}: {name}={value}, but the drafter was trained for "
                f"{config.target.model_id!r} with {name}={expected}; pass that target's GGUF"
            )


def copy_field(writer, name: str, field) -> None:
    """One key of a GGUFReader's file into a GGUFWriter, with its type (and an array's element type)."""
    from gguf import GGUFValueType

    sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
    writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)


def _copy_tokenizer(writer, reader, mask_token_id: int) -> None:
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.") and name != "tokenizer.ggml.mask_token_id":
            copy_field(writer, name, field)
    writer.add_uint32("tokenizer.ggml.mask_token_id", mask_token_id)


def _add_hparams(writer, config: DrafterConfig) -> None:
    writer.add_string("general.name", f"portable-spec {config.kind} drafter for {config.target.model_id}")
    writer.add_uint32(f"{ARCH}.block_count", config.num_hidden_layers)
    writer.add_uint32(f"{ARCH}.context_length", MAX_POSITION_EMBEDDINGS)
    writer.add_uint32(f"{ARCH}.embedding_length", config.hidden_size)
    writer.add_uint32(f"{ARCH}.feed_forward_length", config.intermediate_size)
    writer.add_uint32(f"{ARCH}.attention.head_count", config.num_attention_heads)
    writer.add_uint32(f"{ARCH}.attention.head_count_kv", config.num_key_value_heads)
    writer.add_uint32(f"{ARCH}.attention.key_length", config.head_dim)
    writer.add_uint32(f"{ARCH}.attention.value_length", config.head_dim)
    writer.add_bool(f"{ARCH}.attention.causal", config.block_causal)
    writer.add_float32(f"{ARCH}.rope.freq_base", config.rope_theta)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", config.rms_norm_eps)
    writer.add_uint32(f"{ARCH}.block_size", config.block_size)
    writer.add_array(f"{ARCH}.target_layers", [i + 1 for i in config.target_layer_ids])
    if config.rope_scaling is not None:  # llama.cpp's YaRN: betas 32/1 and scale 0.1 ln(factor) + 1 built in
        writer.add_string(f"{ARCH}.rope.scaling.type", "yarn")
        writer.add_float32(f"{ARCH}.rope.scaling.factor", config.rope_scaling.factor)
        writer.add_uint32(
            f"{ARCH}.rope.scaling.original_context_length", config.rope_scaling.original_max_position_embeddings
        )
    variant = config.variant
    if config.kind == "dflash2":  # what the converter writes from dflash_config (b11434 conversion/qwen.py)
        writer.add_uint32(f"{ARCH}.conv_kernel_size", variant.conv_kernel_size)
        writer.add_uint32(f"{ARCH}.conv_group_size", variant.conv_group_size)
        writer.add_uint32(f"{ARCH}.selector_rank", variant.selector_rank)
        writer.add_uint32(f"{ARCH}.selector_top_k", variant.selector_top_k)
    if config.kind == "dspark":
        writer.add_bool(f"{ARCH}.sample_from_anchor", variant.sample_from_anchor)
        writer.add_bool(f"{ARCH}.has_confidence_head", variant.confidence_head)
    if config.has_windows:
        writer.add_uint32(f"{ARCH}.attention.sliding_window", config.sliding_window)
        pattern = [kind == "sliding_attention" for kind in config.engine_layer_types()]
        writer.add_array(f"{ARCH}.attention.sliding_window_pattern", pattern)


def drafter_tensors(config: DrafterConfig, weights: dict[str, torch.Tensor], target_dir: Path | None) -> dict:
    """llama.cpp name -> float32 numpy array (d2t: int64 target ids), in llama.cpp's layout."""
    tensors: dict[str, np.ndarray] = {}
    rows = None if config.draft_vocab_size is None else target_ids_of(weights.pop("d2t"))
    if rows is not None and not config.own_embeddings:
        if target_dir is None:
            raise SpecError("a draft vocabulary ships its own LM-head rows in the GGUF: pass --target TARGET")
        target = TargetModel.load(target_dir)
        target.check_drafter(config)
        weights["lm_head.weight"] = target.embedding_and_head(rows)["lm_head.weight"]
    for name, tensor in weights.items():
        if name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            out = f"blk.{index}.{LAYER_TENSORS[rest]}"
        else:
            out = TOP_TENSORS[name]
        tensors[out] = tensor.detach().to(torch.float32).contiguous().numpy()
    if rows is not None:
        tensors["d2t"] = rows.to(torch.int64).contiguous().numpy()
    return tensors


def export_gguf(
    drafter_dir: Path, out: Path, target_gguf: Path, target_dir: Path | None = None, force: bool = False
) -> Path:
    """Write OUT/draft.gguf (and a manifest) for `llama-server -m TARGET.gguf -md OUT/draft.gguf
    --spec-type draft-dflash`; nothing is left at OUT on any error."""
    from gguf import GGUFWriter

    drafter_dir, out, target_gguf = Path(drafter_dir), Path(out), Path(target_gguf)
    config, weights = load_drafter_files(drafter_dir)
    check_exportable(config, str(drafter_dir))
    reader = read_target_gguf(target_gguf)
    check_target_gguf(reader, config, target_gguf)
    inputs = (drafter_dir, target_gguf) + (() if target_dir is None else (Path(target_dir),))
    check_output_dir(out, KIND, inputs=inputs, force=force)
    tensors = drafter_tensors(config, weights, target_dir)

    def write(tmp: Path) -> None:
        writer = GGUFWriter(str(tmp / DRAFTER_FILE), ARCH)
        _add_hparams(writer, config)
        writer.add_file_type(0)  # ALL_F32
        _copy_tokenizer(writer, reader, config.mask_token_id)
        for name, array in tensors.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        manifest = {
            "kind": config.kind,
            "block_size": config.block_size,
            "draft_vocab_size": config.draft_vocab_size,
            "target_gguf": target_gguf.name,
            "llamacpp_build": BUILD,  # the llama.cpp this layout was checked against
            "serve": f"llama-server -m {target_gguf.name} -md {DRAFTER_FILE} --spec-type {SPEC_TYPES[config.kind]} "
            f"--spec-draft-n-max {config.max_draft_tokens}",
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")

    return write_dir_atomically(out, write, kind=KIND, force=force)
