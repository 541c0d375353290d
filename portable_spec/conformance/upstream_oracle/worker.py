"""The upstream side of the oracle: run inside an upstream package's own venv (never imports portable_spec).

    python worker.py REQUEST.json

For each case of the request it builds the upstream project's own drafter class on the fixture target, fills it
with seeded random weights (or given ones), saves it the way that project saves (`save_pretrained`), and runs that
project's own forward on the request's features and block, writing the draft logits of every slot
(`<case>/oracle.safetensors`, [1, k, vocab] float32 over the target vocabulary; -inf outside a draft vocabulary)
and what ran (`<case>/oracle.json`). Where the project ships a decode loop (z-lab `dflash_generate`) it also decodes
the request's prompt greedily and records the tokens and the accepted length of every round.

The forward each project is taken through is the one its trainer (or decode loop) runs:
- dflash 0.1.0 (z-lab): `DFlashDraftModel.forward` with no mask, as `dflash_generate` calls it; the model builds
  its own mask (`_attention_mask`: `is_causal` per layer, window q - k < W), logits by `compute_logits` on the
  target's head. A DFlash2 case builds `DFlash2DraftModel` (the same forward, its convolutions around every
  sublayer) and also records the drafts its `propose` picks greedily (the candidate selector).
- speculators 0.9.0: `DFlashDraftModel.from_training_args` (its trainer's builder; verifier = the fixture target)
  and `_backbone_forward` with one anchor (its trainer's mask `create_anchor_block_mask_mod`: context
  k >= anchor - W in sliding layers, full layers bidirectional, sliding ones causal unless
  `sliding_window_non_causal`), logits from its own `lm_head` (the draft vocabulary's rows when reduced).
  A DSpark case builds `DSparkDraftModel` the same way and runs its Markov and confidence heads on the block
  (dspark_heads): teacher-forced logits and confidence on the prompt's true continuation, and a greedy chain.
- specforge 0.2.0: `OnlineDFlashModel._forward_draft_blocks` (its trainer's forward, sdpa mask
  `create_dflash_sdpa_mask`: window per slot, causal in sliding layers) with one anchor, logits on the target's head.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3Config


def seeded_weights(model: torch.nn.Module, seed: int, skip: tuple[str, ...]) -> None:
    """Random weights large enough that attention is far from uniform (so a changed mask changes the logits):
    matrices ~ N(0, 1/fan_in), norms 1 + N(0, 0.1^2); the target-owned tensors in `skip` are left alone."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if any(part in name for part in skip):
                continue
            if parameter.dim() == 1:
                parameter.copy_(1 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)


def layer_config(case: dict, target_config) -> Qwen3Config:
    """The drafter's Qwen3 layer config, as each project writes one (rope, windows, shapes)."""
    rope = {"rope_type": "default", "rope_theta": case["rope_theta"]}
    if case.get("yarn"):
        rope = {"rope_type": "yarn", "rope_theta": case["rope_theta"], **case["yarn"]}
    sliding = case.get("layer_types") and "sliding_attention" in case["layer_types"]
    return Qwen3Config(
        vocab_size=target_config.vocab_size,
        hidden_size=target_config.hidden_size,
        num_hidden_layers=case["num_hidden_layers"],
        num_attention_heads=case["num_attention_heads"],
        num_key_value_heads=case["num_key_value_heads"],
        head_dim=case["head_dim"],
        intermediate_size=case["intermediate_size"],
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,  # = factor x original for the YaRN case, as transformers expects
        rope_parameters=rope,
        layer_types=case.get("layer_types") or ["full_attention"] * case["num_hidden_layers"],
        use_sliding_window=bool(sliding),
        sliding_window=case["sliding_window"] if sliding else None,
        max_window_layers=0 if sliding else case["num_hidden_layers"],
        tie_word_embeddings=False,
    )


def full_vocab_logits(logits: torch.Tensor, draft_ids: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """[1, k, V_draft] -> [1, k, vocab]: a draft vocabulary's logits at their target ids, -inf elsewhere."""
    if draft_ids is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
    return full.scatter(-1, draft_ids.expand(*logits.shape[:-1], -1), logits)


# -- z-lab dflash ------------------------------------------------------------------------------------------------
def run_dflash(case: dict, target, inputs: dict, out: Path) -> dict:
    from dflash.model import DFlash2DraftModel, DFlashDraftModel

    dflash2 = case.get("dflash2")
    config = layer_config(case, target.config)
    config.architectures = ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"]
    config.num_target_layers = target.config.num_hidden_layers
    config.block_size = case["block_size"]
    config.dflash_config = {
        "target_layer_ids": case["target_layer_ids"],
        "mask_token_id": case["mask_token_id"],
        "block_size": case["block_size"],
        **(dflash2 or {}),
    }
    if case.get("causal") is not None:
        config.is_causal = case["causal"]
    torch.manual_seed(case["seed"])
    model = (DFlash2DraftModel if dflash2 else DFlashDraftModel)(config).float().eval()
    load_or_seed(model, case, skip=(), own=DFLASH2_OWN if dflash2 else ())
    model.save_pretrained(out / "checkpoint")
    features, block = inputs["features"], inputs["block_ids"]
    length, k = features.shape[1], block.shape[1]
    with torch.no_grad():
        hidden = model(
            position_ids=torch.arange(length + k)[None],
            noise_embedding=F.embedding(block, target.get_input_embeddings().weight),
            target_hidden=features,
        )
        logits = model.compute_logits(hidden, target.lm_head)
    result = {"logits": logits.float()}
    info = {"forward": f"dflash.model.{type(model).__name__}.forward (mask from its _attention_mask)"}
    if dflash2:
        with torch.no_grad():  # its selector over the draft slots, greedy, as dflash_generate calls it
            drafts, _, _ = model.propose(hidden[:, 1:], block[:, 0], target.lm_head, 0.0)
        result["drafts"] = drafts
        info["drafts"] = "dflash.model.DFlash2DraftModel.propose (CandidateSelector.select, temperature 0)"
    if case.get("decode"):
        info["decode"] = decode_rounds(model, target, inputs["prompt_ids"], case)
    return result, info


def decode_rounds(model, target, prompt_ids, case) -> dict:
    """Tokens emitted per round (accepted drafts + 1, cut at max_new_tokens) by z-lab's own `dflash_generate`,
    read off its return_stats; its timer synchronizes CUDA, so it is replaced by perf_counter on a CPU."""
    import time

    import dflash.model as zlab

    zlab._cuda_time = time.perf_counter  # its only CUDA call; the decode itself is device-agnostic
    stats = zlab.dflash_generate(
        model,
        target,
        prompt_ids,
        max_new_tokens=case["decode"]["max_new_tokens"],
        stop_token_ids=None,
        block_size=case["block_size"],
        return_stats=True,
    )
    return {
        "tokens": stats.output_ids[0, prompt_ids.shape[1] :].tolist(),
        "emitted_per_round": [int(n) for n in stats.acceptance_lengths],
        "max_new_tokens": case["decode"]["max_new_tokens"],
    }


# -- vLLM speculators --------------------------------------------------------------------------------------------
def run_speculators(case: dict, target, inputs: dict, out: Path) -> dict:
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.dflash2 import DFlash2DraftModel
    from speculators.models.dspark import DSparkDraftModel

    dflash2, dspark = case.get("dflash2"), case.get("dspark")
    builder = DFlash2DraftModel if dflash2 is not None else DSparkDraftModel if dspark is not None else DFlashDraftModel
    draft_ids = inputs.get("draft_ids")
    if case.get("load"):  # a directory written elsewhere (portable-spec's export): read by speculators' own classes
        model = load_saved_speculator(builder, Path(case["load"]))
    else:
        model, draft_ids = built_speculator(builder, case, target, draft_ids)
        model.save_pretrained(out / "checkpoint")
    features, block = inputs["features"], inputs["block_ids"]
    length, k = features.shape[1], block.shape[1]
    anchor = length  # the block's slot 0 sits right after the context, as in decoding
    # the packed row: context, the anchor, then positions the mask hides from the block; select_anchors never
    # draws from the last block_size positions, so the row runs one past the block
    total = length + k + 1
    input_ids = torch.zeros(1, total, dtype=torch.long)
    input_ids[0, anchor] = block[0, 0]
    loss_mask = torch.zeros(1, total, dtype=torch.long)
    loss_mask[0, anchor] = 1
    hidden_states = torch.cat((features, torch.zeros(1, total - length, features.shape[-1])), dim=1)
    with torch.no_grad():
        hidden, logits, _, _, drawn = model._backbone_forward(
            hidden_states,
            input_ids,
            loss_mask,
            torch.zeros(1, total, target.config.hidden_size),
            torch.zeros(1, total, dtype=torch.long),
            max_anchors=1,
        )
    if drawn.tolist() != list(range(anchor, anchor + k)):
        raise RuntimeError(f"speculators drew the block at {drawn.tolist()}, expected it at {anchor}..{anchor + k - 1}")
    logits = full_vocab_logits(logits.float(), draft_ids, target.config.vocab_size)
    result = {"logits": logits}
    info = {"forward": f"speculators {builder.__name__}._backbone_forward (its trainer's mask)"}
    if dflash2:
        result["drafts"] = greedy_selector_chain(model.candidate_selector, hidden, logits, block[0, 0])
        info["drafts"] = "greedy chain over speculators CandidateSelector.score_candidates, slot after slot"
    if dspark:
        result.update(dspark_heads(model, hidden, inputs["true_tokens"][:, :k], draft_ids, target))
        info["forward"] += "; its MarkovHead.block_bias and ConfidenceHead, teacher-forced on the true block"
        info["drafts"] = "greedy chain: its MarkovHead.block_bias over the drafts so far, slot after slot"
    return result, info


def dspark_heads(model, hidden, block_tokens, draft_ids, target) -> dict:
    """A DSpark's heads run as speculators 0.9.0 DSparkDraftModel.forward runs them on one block (its previous-token
    rule, copied from that forward: the block's tokens with sample_from_anchor, else shifted one right keeping the
    anchor): `logits` [1, k, V] with the Markov bias given the true tokens `block_tokens` [1, k], `confidence`
    [1, k]; and `drafts` [1, n], a greedy chain through its own MarkovHead.block_bias on the drafts so far (the
    recurrent head unrolled from slot 0, as its block_bias does), n = k with sample_from_anchor, else k - 1."""
    head, from_anchor = model.markov_head, model.config.sample_from_anchor
    vocab = target.config.vocab_size
    with torch.no_grad():
        if from_anchor:
            prev = block_tokens
        else:
            prev = torch.cat([block_tokens[:, :1], block_tokens[:, :-1]], dim=1)
        base = model.lm_head(hidden)  # [1, k, V_draft]
        biased = base + head.block_bias(prev_token_ids=prev, hidden_states=hidden)
        features = hidden
        if model.config.confidence_head_with_markov:
            features = torch.cat([hidden, head.prev_embeddings(prev).to(hidden.dtype)], dim=-1)
        confidence = model.confidence_head(features)
        chain = [block_tokens[0, 0]] * (1 if from_anchor else 2)  # previous tokens of slots 0 .. s
        drafts = []
        for slot in range(0 if from_anchor else 1, hidden.shape[1]):
            ids = torch.stack(chain)[None]
            bias = head.block_bias(prev_token_ids=ids, hidden_states=hidden[:, : slot + 1])[:, -1]
            scored = full_vocab_logits((base[:, slot] + bias)[:, None].float(), draft_ids, vocab)[:, 0]
            drafts.append(scored.argmax(dim=-1)[0])
            chain.append(drafts[-1])
    return {
        "logits": full_vocab_logits(biased.float(), draft_ids, vocab),
        "confidence": confidence.float(),
        "drafts": torch.stack(drafts)[None],
    }


def built_speculator(builder, case: dict, target, draft_ids):
    """speculators' drafter through its trainer's builder (`from_training_args`, verifier = the fixture target), with
    the case's weights; returns it and the draft ids in speculators' d2t order (None: the full vocabulary)."""
    config = layer_config(case, target.config)
    t2d = d2t = None
    if draft_ids is not None:
        t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool)
        t2d[draft_ids] = True
        ordered = draft_ids.sort().values  # speculators' d2t: draft id -> target id offset, in target-id order
        d2t = ordered - torch.arange(len(ordered))
        draft_ids = ordered
    kwargs = {
        "verifier_name_or_path": case["target_dir"],
        "target_layer_ids": [i + 1 for i in case["target_layer_ids"]],  # HF hidden_states indices
        "draft_vocab_size": len(draft_ids) if draft_ids is not None else target.config.vocab_size,
        "block_size": case["block_size"],
        "mask_token_id": case["mask_token_id"],
        "draft_attn_impl": "sdpa",
    }
    if case.get("causal") is not None:  # speculators' switch is the opposite: sliding_window_non_causal
        kwargs["sliding_window_non_causal"] = not case["causal"]
    torch.manual_seed(case["seed"])
    dflash2, dspark = case.get("dflash2"), case.get("dspark")
    model = builder.from_training_args(config, t2d=t2d, d2t=d2t, **kwargs, **(dflash2 or dspark or {})).float().eval()
    skip = ("embed_tokens", "lm_head", "verifier_", "t2d", "d2t")
    load_or_seed(model, case, skip=skip, own=DFLASH2_OWN if dflash2 else DSPARK_OWN if dspark else ())
    return model, draft_ids


def load_saved_speculator(builder, directory: Path):
    """A saved speculators checkpoint through speculators' own config class and model class: its config.json parsed
    by `SpeculatorModelConfig.from_pretrained` (which picks the class registered for `speculators_model_type`), the
    model built from it and every weight of model.safetensors loaded strictly but the verifier's own copies, which
    its `from_pretrained` would fetch from the verifier named in the file (the hub: not reachable here)."""
    from speculators import SpeculatorModelConfig

    config = SpeculatorModelConfig.from_pretrained(str(directory))
    model = builder(config).float().eval()
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not name.startswith("verifier_")]
    if missing or unexpected:
        raise RuntimeError(
            f"{directory} does not fit speculators' {builder.__name__}: missing {missing}, unexpected {unexpected}"
        )
    return model


def greedy_selector_chain(selector, hidden, logits, anchor) -> torch.Tensor:
    """[1, k - 1] drafts: slot after slot, the top-k candidates scored by speculators' own `score_candidates`
    given the draft before (the anchor first), the best kept; what vLLM's DFlash2 proposer runs greedily."""
    predecessor, drafts = anchor.view(1), []
    with torch.no_grad():
        for slot in range(1, logits.shape[1]):
            unary = logits[:, slot]
            candidates = unary.topk(selector.top_k, dim=-1).indices
            scores = selector.score_candidates(unary, hidden[:, slot], predecessor, candidates)
            predecessor = candidates.gather(-1, scores.argmax(dim=-1, keepdim=True))[:, 0]
            drafts.append(predecessor)
    return torch.stack(drafts, dim=1)


# -- SpecForge -------------------------------------------------------------------------------------------------
def run_specforge(case: dict, target, inputs: dict, out: Path) -> dict:
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.modeling.draft.domino import DominoDraftModel

    domino = case.get("domino")
    config = layer_config(case, target.config)
    config.architectures = ["DominoDraftModel" if domino else "DFlashDraftModel"]
    config.block_size = case["block_size"]
    config.num_target_layers = target.config.num_hidden_layers
    config.dflash_config = {"target_layer_ids": case["target_layer_ids"], "mask_token_id": case["mask_token_id"]}
    if domino:
        config.dflash_config.update(projector_type="domino", **domino)
    config._attn_implementation = "sdpa"
    torch.manual_seed(case["seed"])
    model = (DominoDraftModel if domino else DFlashDraftModel)(config).float().eval()
    load_or_seed(model, case, skip=(), own=DOMINO_OWN if domino else ())
    model.save_pretrained(out / "checkpoint")
    trainer = OnlineDFlashModel(
        model,
        target.lm_head,
        target.get_input_embeddings(),
        case["mask_token_id"],
        block_size=case["block_size"],
        attention_backend="sdpa",
        num_anchors=1,
    )
    features, block = inputs["features"], inputs["block_ids"]
    length = features.shape[1]
    total = length + 2  # the anchor and the token after it are supervised: the only anchor it may draw
    input_ids = torch.zeros(1, total, dtype=torch.long)
    input_ids[0, length] = block[0, 0]
    loss_mask = torch.zeros(1, total)
    loss_mask[0, length : length + 2] = 1
    hidden_states = torch.cat((features, torch.zeros(1, 2, features.shape[-1])), dim=1)
    with torch.no_grad():
        anchors, _, hidden = trainer._forward_draft_blocks(input_ids, hidden_states, loss_mask)
        logits = target.lm_head(hidden)
    if anchors.tolist() != [[length]]:
        raise RuntimeError(f"SpecForge drew anchors {anchors.tolist()}, expected [[{length}]]")
    info = {"forward": "specforge OnlineDFlashModel._forward_draft_blocks (its trainer's create_dflash_sdpa_mask)"}
    if not domino:
        return {"logits": logits.float()}, info
    with torch.no_grad():  # its own head, teacher-forced on the true block, and its own block sampler (greedy)
        embeddings = target.get_input_embeddings()(inputs["true_tokens"][:, : block.shape[1]])
        final = model.apply_logits_head(logits[:, None], prev_token_embeddings=embeddings[:, None],
                                        hidden_states=hidden[:, None])[:, 0]  # fmt: skip
        drafts = model._sample_draft_tokens(target, hidden, block.clone())
    info["forward"] += "; its DominoDraftModel.apply_logits_head on the true block"
    info["drafts"] = "specforge DominoDraftModel._sample_draft_tokens (greedy)"
    return {"logits": final.float(), "drafts": drafts}, info


RUNNERS = {"dflash": run_dflash, "speculators": run_speculators, "specforge": run_specforge}


DFLASH2_OWN = ("_conv.", "candidate_selector.")  # DFlash2's own tensors: seeded, never in the given weights
DSPARK_OWN = ("markov_head.", "confidence_head.")  # DSpark's
DOMINO_OWN = ("prefix_gru.", "embed_proj.")  # Domino's


def load_or_seed(model: torch.nn.Module, case: dict, skip: tuple[str, ...], own: tuple[str, ...] = ()) -> None:
    """Given weights (a trained drafter's tensors under the upstream names) or seeded random ones; the tensors
    named by `own` (a DFlash2's convolutions and selector, which a DFlash drafter has none of) seeded either way."""
    if case.get("weights"):
        missing, unexpected = model.load_state_dict(load_file(case["weights"]), strict=False)
        owned = [name for name in missing if not any(part in name for part in skip + own)]
        if owned or unexpected:
            raise RuntimeError(f"weights do not fit the upstream model: missing {owned}, unexpected {unexpected}")
    else:
        seeded_weights(model, case["seed"], skip + own)
    if own == DFLASH2_OWN:
        seeded_dflash2(model, case["seed"])
    elif own == DSPARK_OWN:
        seeded_dspark(model, case["seed"])
    elif own == DOMINO_OWN:
        seeded_domino(model, case["seed"])


def seeded_dflash2(model: torch.nn.Module, seed: int) -> None:
    """A DFlash2's convolutions far from the identity they start as (each tap and the dynamic kernels matter) and
    its selector's bigram scores as large as the logits' spread (so the selector changes picks)."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("base_kernel"):
                parameter.copy_(0.3 * noise)
                parameter[:, 0] += 1.0
            elif name.endswith("kernel_projection.weight"):
                parameter.copy_(0.3 * noise / parameter.shape[-1] ** 0.5)
            elif "candidate_selector." in name:
                parameter.copy_(noise / (parameter.shape[-1] ** 0.5 if name.endswith("projection.weight") else 1))


def seeded_dspark(model: torch.nn.Module, seed: int) -> None:
    """A DSpark's Markov bias about as large as the trained drafter's logit spread (so it changes picks) and every
    other head tensor at the scale seeded_weights gives."""
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if not name.startswith(DSPARK_OWN):
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("markov_w1.weight"):
                parameter.copy_(noise)
            elif name.endswith("markov_w2.weight"):
                parameter.copy_(4 * noise / parameter.shape[-1] ** 0.5)
            else:
                parameter.copy_(noise / parameter.shape[-1] ** 0.5 if parameter.dim() == 2 else 0.1 * noise)


def seeded_domino(model: torch.nn.Module, seed: int) -> None:
    """A Domino's correction about as large as the trained drafter's logit spread (so it changes picks)."""
    generator = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if name.startswith(DOMINO_OWN):
                scale = 6.0 if name == "embed_proj.2.weight" else 1.0
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    package = request["package"]
    torch.set_num_threads(request.get("threads", 1))
    target = AutoModelForCausalLM.from_pretrained(request["target_dir"], dtype=torch.float32).eval()
    for case in request["cases"]:
        out = Path(case["out"])
        out.mkdir(parents=True, exist_ok=True)
        inputs = load_file(case["inputs"])
        tensors, info = RUNNERS[package]({**case, "target_dir": request["target_dir"]}, target, inputs, out)
        save_file({name: t.contiguous() for name, t in tensors.items()}, str(out / "oracle.safetensors"))
        info.update(package=package, package_version=version(package), transformers=version("transformers"))
        (out / "oracle.json").write_text(json.dumps(info, indent=1))
        print(f"{package} {case['name']}: ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
