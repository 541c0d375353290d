"""The drafter: fused target features injected as KV into every layer; one code path for every variant.

Shapes: B requests, A blocks per request (A = 1 at inference, many anchors in training), k slots per block,
T context positions, H hidden, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from portable_spec.core.attention import BlockMask, anchor_window_mask, window_mask, within_block_mask
from portable_spec.core.checkpoint import load_drafter_files, save_drafter
from portable_spec.core.domino import block_corrections, domino_modules
from portable_spec.core.drafter_layers import DrafterLayer, rotary_cos_sin, rotary_frequencies
from portable_spec.core.head_step import DominoStep, HeadStep, MarkovStep, SelectorStep, chain_drafts
from portable_spec.core.markov import ConfidenceHead, MarkovHead, confidence_input, previous_tokens
from portable_spec.core.sampling import greedy_with_probability
from portable_spec.core.selector import CandidateSelector
from portable_spec.core.spec import DrafterConfig, LayerAttention, SpecError
from portable_spec.core.variants import behaviour_of

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v), each [B, kv_heads, T, head_dim]


@dataclass
class SharedTargetModules:
    """The target's frozen embedding and LM head, which a drafter without own_embeddings uses but does not own or
    save."""

    embed_tokens: nn.Module  # ids [...] -> [..., H]
    lm_head: nn.Module  # [..., H] -> logits [..., V]


class Drafter(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.behaviour = behaviour_of(config.kind)
        self.fc = nn.Linear(config.feature_size, config.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DrafterLayer(config, self.behaviour.shift_mix, self.behaviour.sublayer_conv)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = rotary_frequencies(config)  # not a buffer: float32 whatever dtype the drafter is cast to
        if config.draft_vocab_size is not None:  # EAGLE-3 layout: target id = draft id + d2t[draft id]
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        if config.own_embeddings:  # saved with the drafter (vLLM's names: embed_tokens, lm_head)
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
            self.lm_head = nn.Linear(config.hidden_size, config.scored_vocab_size, bias=False)
        if self.behaviour.candidate_selector:  # DFlash2: drafts picked slot after slot from each slot's top-k
            variant = config.variant
            self.candidate_selector = CandidateSelector(
                config.vocab_size, config.hidden_size, variant.selector_rank, variant.selector_top_k
            )
        if self.behaviour.markov_head:  # DSpark: a bias from the token before each slot, and a confidence head
            variant = config.variant
            self.markov_head = MarkovHead(
                config.vocab_size,
                config.scored_vocab_size,
                variant.markov_rank,
                config.hidden_size,
                variant.markov_head_type,
            )
            if variant.confidence_head:
                markov = variant.markov_rank if variant.confidence_head_with_markov else 0
                self.confidence_head = ConfidenceHead(config.hidden_size + markov)
        if self.behaviour.gru_head:  # Domino: a GRU over the block's tokens corrects each slot (SpecForge's names)
            variant = config.variant
            self.prefix_gru, self.embed_proj = domino_modules(
                config.hidden_size, config.vocab_size, variant.emb_dim, variant.gru_hidden_dim
            )
        self.shared: SharedTargetModules | None = None  # the target's modules, given by TargetModel.bind
        self._head_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor]] | None = None

    # -- vocabulary ------------------------------------------------------------------------------
    def draft_token_ids(self) -> torch.Tensor | None:
        """Target ids of the draft vocabulary [V_draft], or None when the drafter scores the full vocabulary."""
        if self.config.draft_vocab_size is None:
            return None
        return target_ids_of(self.d2t)

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Fix the draft vocabulary to `target_ids` (distinct, [V_draft]); stored as EAGLE-3 offsets."""
        ids = torch.as_tensor(target_ids, dtype=torch.int64)
        check_draft_vocab(ids, self.config)
        self.d2t.copy_(ids - torch.arange(len(ids), device=ids.device))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Block token ids [...] -> [..., H] in the drafter's dtype: its own embedding, or the target's."""
        module = self.embed_tokens if self.config.own_embeddings else self.shared.embed_tokens
        return module(ids).to(self.fc.weight.dtype)

    def scored_logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., H] final hidden -> [..., config.scored_vocab_size]: the drafter's own head, or the target's LM head
        restricted to the draft vocabulary's rows when there is one (the slice is cached; the target is frozen).

        `h` is made contiguous first: callers pass the draft slots' slice of a block's states, and torch 2.13's CPU
        linear on a non-contiguous [..., H] input is ~5x slower than the copy plus a contiguous GEMM (measured on
        AMD EPYC, one thread: 2.1 s against 0.38 s for 64 x 3 slots x the 49,152-row SmolLM2 head; the held-out
        evaluation and every training step score such slices)."""
        h = h.contiguous()
        if self.config.own_embeddings:
            return self.lm_head(h)
        if self.config.draft_vocab_size is None:
            head = self.shared.lm_head
            if head.weight.dtype == h.dtype:
                return head(h)
            bias = getattr(head, "bias", None)  # a bf16 target's head scoring an fp32 drafter's states (training)
            return torch.nn.functional.linear(h, head.weight.to(h.dtype), None if bias is None else bias.to(h.dtype))
        ids, weight = self._draft_head()
        return torch.nn.functional.linear(h, weight.to(h.dtype))

    def _draft_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(target ids [V_draft], LM-head rows [V_draft, H]), cached while the target's head and d2t are unchanged."""
        weight = self.shared.lm_head.weight
        key = (weight.data_ptr(), weight.dtype, weight._version, self.d2t._version)
        if self._head_cache is None or self._head_cache[0] != key:
            ids = self.draft_token_ids().detach().clone()
            self._head_cache = (key, (ids, weight.detach()[ids].contiguous()))
        return self._head_cache[1]

    # -- context ---------------------------------------------------------------------------------
    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """features [B, T, len(ids)*H_target] at `positions` [B, T] -> per-layer injected (k, v)."""
        if features.shape[-1] != self.config.feature_size:
            raise SpecError(
                f"target features have width {features.shape[-1]}, drafter expects feature_size="
                f"{self.config.feature_size} (= {len(self.config.target_layer_ids)} layers x "
                f"{self.config.target.hidden_size}); check target_layer_ids and the target's hidden_size"
            )
        fused = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        cos, sin = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, fused.dtype, self.rotary)
        return [layer.self_attn.project_kv(fused, cos, sin) for layer in self.layers]

    # -- blocks ----------------------------------------------------------------------------------
    def block_logits(
        self,
        block_ids: torch.Tensor,  # [B, A, k]
        block_positions: torch.Tensor,  # [B, A, k]
        context: ContextKV,
        context_mask: torch.Tensor,  # [B, A*k, T] bool per block slot, or [B, T] for one block per request
        context_positions: torch.Tensor | None = None,  # [B, T]; needed by sliding-window layers only
    ) -> torch.Tensor:  # [B, A, k, V]
        """Logits over the target vocabulary; with a draft vocabulary, -inf outside it (as vLLM's DFlash does), so
        argmax, sampling and every backend's comparison need no id mapping."""
        hidden = self.block_hidden(block_ids, block_positions, context, context_mask, context_positions)
        return self.to_full_vocab(self.scored_logits(hidden))

    def to_full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Scored logits [..., V_scored] -> [..., V]: a draft vocabulary's at their target ids, -inf elsewhere."""
        if self.config.draft_vocab_size is None:
            return logits
        ids = self.draft_token_ids() if self.config.own_embeddings else self._draft_head()[0]
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.scatter(-1, ids.expand(*logits.shape[:-1], -1), logits)

    def block_hidden(
        self,
        block_ids: torch.Tensor,  # [B, A, k]
        block_positions: torch.Tensor,  # [B, A, k]
        context: ContextKV,
        context_mask: torch.Tensor,  # [B, A*k, T] bool per block slot, or [B, T] for one block per request
        context_positions: torch.Tensor | None = None,  # [B, T]; needed by sliding-window layers only
    ) -> torch.Tensor:  # [B, A, k, H], after the final norm
        """A [B, T] context mask (decoding: one block per request, every slot sees the same context) takes the
        dispatched attention (the Triton kernel on CUDA) in full-attention layers; a per-slot mask (training's
        packed blocks, or a sliding window) the dense one."""
        if self.shared is None:
            raise SpecError("drafter is not bound to a target; load it with target.load_drafter(dir)")
        b, a, k = block_ids.shape
        h = self.embed(block_ids)
        flat_positions = block_positions.reshape(b, a * k)
        cos, sin = rotary_cos_sin(flat_positions, self.config.head_dim, self.config.rope_theta, h.dtype, self.rotary)
        if context_mask.dim() == 2 and a != 1:
            raise ValueError(f"a [B, T] context mask serves one block per request, got {a} blocks per row")
        masks: dict[LayerAttention, BlockMask] = {}
        for index, (layer, (context_k, context_v)) in enumerate(zip(self.layers, context)):
            attention = self.config.layer_attention(index)
            if attention not in masks:
                masks[attention] = _layer_mask(attention, context_mask, flat_positions, context_positions, k, a)
            h = layer(h, cos, sin, context_k, context_v, masks[attention])
        return self.norm(h)

    def prediction_slot(self, offset: int) -> int:
        """Block slot whose logits predict the token `offset` (>= 1) places after the anchor."""
        return offset - 1 if self.config.drafts_from_anchor else offset

    def draft_slots(self, num_drafts: int) -> slice:
        """The block slots whose logits predict the first `num_drafts` tokens after the anchor."""
        first = self.prediction_slot(1)
        return slice(first, first + num_drafts)

    def teacher_forced_logits(self, hidden: torch.Tensor, block_tokens: torch.Tensor) -> torch.Tensor:
        """Whole blocks' final states [..., k, H] and the true tokens from each anchor on [..., >= k] -> the draft
        slots' scored logits [..., max_draft_tokens, V_scored]; a dspark's with its Markov bias given the true token
        before each slot (how speculators 0.9.0 trains it)."""
        slots = self.draft_slots(self.config.max_draft_tokens)
        logits = self.scored_logits(hidden[..., slots, :])
        k = self.config.block_size
        if self.behaviour.gru_head:  # Domino: slots 1 .. k-1, the GRU over the true tokens before each
            previous = self.embed(block_tokens[..., : k - 1])
            shape = previous.shape[:-2]
            corrections = block_corrections(
                self.prefix_gru,
                self.embed_proj,
                previous.reshape(-1, k - 1, previous.shape[-1]),
                hidden.reshape(-1, k, hidden.shape[-1]),
                self.config.variant.pure_draft_prefix_len,
            )
            return logits + corrections.view(*shape, k - 1, -1)
        if not self.behaviour.markov_head:
            return logits
        previous = previous_tokens(block_tokens[..., :k], self.config.drafts_from_anchor)
        return logits + self.markov_head.block_bias(previous, hidden)[..., slots, :]

    def confidence_logits(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """A dspark's predicted acceptance logit per slot [...]: slot states [..., H], previous-token ids [...]."""
        embedding = self.markov_head.embed(previous)
        return self.confidence_head(
            confidence_input(hidden, embedding, self.config.variant.confidence_head_with_markov)
        )

    @torch.no_grad()
    def propose(
        self,
        context: ContextKV,
        context_valid: torch.Tensor,  # [B, T] bool
        anchor_tokens: torch.Tensor,  # [B]: last verified token, at position anchor_positions
        anchor_positions: torch.Tensor,  # [B]
        num_drafts: int,  # checked once per generate call (decode.py), not every round
        context_positions: torch.Tensor | None = None,  # [B, T]; needed by sliding-window layers only
    ) -> torch.Tensor:  # draft_tokens [B, num_drafts], greedy
        return self.propose_scored(
            context, context_valid, anchor_tokens, anchor_positions, num_drafts, context_positions
        )[0]

    @torch.no_grad()
    def propose_scored(
        self, context, context_valid, anchor_tokens, anchor_positions, num_drafts, context_positions=None
    ):
        """Greedy drafts [B, n] and the drafter's own probability of each [B, n] (for confidence-cut rounds)."""
        return self.propose_drafts(
            context, context_valid, anchor_tokens, anchor_positions, num_drafts, context_positions
        )[:2]

    @torch.no_grad()
    def propose_drafts(
        self, context, context_valid, anchor_tokens, anchor_positions, num_drafts, context_positions=None, sampler=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(drafts [B, n], each one's probability [B, n], the q [B, n, V] they were drawn from or None): greedy, or,
        for a kind that picks slot after slot (behaviour.sequential_head), drawn by `sampler`
        (sampling.DraftSampler) from the distribution each slot has given the drafts before it."""
        if sampler is not None and not self.behaviour.sequential_head:
            raise ValueError(f"a {self.config.kind} drafter drafts greedily; only sequential heads sample drafts")
        # A block with bidirectional layers needs every trained slot (slots see later ones); a causal one is exact
        # when cut.
        width = self.draft_slots(num_drafts).stop if self.config.block_causal else self.config.block_size
        if self.behaviour.autoregressive:
            width = num_drafts + 1  # each draft is written into the slot after the one that predicted it
        if self.behaviour.sequential_head:  # one pass over [anchor, MASK...], then the head picks slot after slot
            block = anchor_block(self.config, anchor_tokens, width)
            positions = anchor_positions[:, None, None] + torch.arange(width, device=block.device)
            hidden = self.block_hidden(block, positions, context, context_valid, context_positions)[:, 0]
            return self.head_drafts(hidden, anchor_tokens, num_drafts, sampler)

        def run(block):
            k = block.shape[-1]
            positions = anchor_positions[:, None, None] + torch.arange(k, device=block.device)
            return self.block_logits(block, positions, context, context_valid, context_positions)

        return (*greedy_drafts(run, self.config, anchor_tokens, num_drafts, width), None)

    def head_drafts(
        self, hidden: torch.Tensor, anchor_tokens: torch.Tensor, num_drafts: int, sampler=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A sequential head's drafts from one block's final states [B, >= last draft slot + 1, H] after anchors
        [B]: DSpark's Markov chain, Domino's GRU chain or DFlash2's selector (head_step.py), greedy or drawn by
        `sampler`: what decoding and the held-out acceptance both call, and what the ONNX proposer runs with the
        exported step graph."""
        step = self.head_step()
        logits = self.to_full_vocab(
            self.scored_logits(hidden[:, step.slots.first : step.slots.first_draft + num_drafts])
        )
        return chain_drafts(
            step, step.slots, hidden, logits, anchor_tokens, num_drafts, step.initial_state(hidden), sampler
        )

    def head_step(self) -> HeadStep:
        """The sequential head as one slot's step over this drafter's modules (head_step.py)."""
        if self.behaviour.markov_head:
            confidence = getattr(self, "confidence_head", None)
            return MarkovStep(self.config, self.markov_head, confidence, self.draft_token_ids())
        if self.behaviour.gru_head:
            embed = self.embed_tokens if self.config.own_embeddings else self.shared.embed_tokens
            return DominoStep(self.config, self.prefix_gru, self.embed_proj, embed, self.fc.weight.dtype)
        if self.behaviour.candidate_selector:
            return SelectorStep(self.config, self.candidate_selector)
        raise ValueError(f"a {self.config.kind} drafter has no sequential head")

    # -- persistence -----------------------------------------------------------------------------
    def save(self, out_dir: Path, force: bool = False, owner: str | None = None) -> Path:
        return save_drafter(out_dir, self.config, self.state_dict(), force=force, owner=owner)


def _layer_mask(
    attention: LayerAttention,
    context_mask: torch.Tensor,  # [B, T] or [B, A*k, T]
    query_positions: torch.Tensor,  # [B, A*k]
    context_positions: torch.Tensor | None,  # [B, T]
    block_size: int,
    num_blocks: int,
) -> BlockMask:
    """One layer's BlockMask: the one-block form (the dispatched kernel) for a full-attention layer decoding, else
    the dense [B, 1, A*k, T + A*k] mask with the layer's window cut into the context part. Slots of one block are
    never windowed apart (DrafterConfig requires sliding_window >= block_size)."""
    if context_mask.dim() == 2 and attention.window is None:
        return BlockMask(context_valid=context_mask, block_causal=attention.block_causal)
    if context_mask.dim() == 2:
        context_mask = context_mask[:, None, :].expand(-1, query_positions.shape[1], -1)
    if attention.window is not None:
        if context_positions is None:
            raise ValueError("a sliding-window layer needs the context's positions (context_positions [B, T])")
        if attention.window_per_anchor:  # every slot measures from its block's slot 0, the anchor
            b = query_positions.shape[0]
            anchors = query_positions.view(b, num_blocks, block_size)[:, :, :1].expand(-1, -1, block_size)
            in_window = anchor_window_mask(anchors.reshape(b, -1), context_positions, attention.window)
        else:
            in_window = window_mask(query_positions, context_positions, attention.window)
        context_mask = context_mask & in_window
    within = within_block_mask(block_size, attention.block_causal, num_blocks, context_mask.device)
    return BlockMask(dense=torch.cat((context_mask, within.expand(context_mask.shape[0], -1, -1)), dim=-1)[:, None])


def target_ids_of(d2t: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's draft-vocabulary offsets -> the target ids they stand for: target id = draft id + d2t[draft id]."""
    return torch.arange(len(d2t), device=d2t.device) + d2t.to(torch.int64)


def check_draft_vocab(target_ids: torch.Tensor, config: DrafterConfig, source: str = "draft vocabulary") -> None:
    """A draft vocabulary is draft_vocab_size distinct target ids inside the target's vocabulary."""
    ids = target_ids.tolist()
    if (
        len(ids) != config.draft_vocab_size
        or len(set(ids)) != len(ids)
        or min(ids) < 0
        or max(ids) >= config.vocab_size
    ):
        raise SpecError(
            f"{source}: needs {config.draft_vocab_size} distinct ids in [0, {config.vocab_size}), got "
            f"{len(ids)} ids ({len(set(ids))} distinct, from {min(ids, default=None)} to {max(ids, default=None)})"
        )


def anchor_block(config: DrafterConfig, anchor_tokens: torch.Tensor, width: int) -> torch.Tensor:
    """[B, 1, width] block ids: each request's anchor, then the mask token (what every propose path drafts from)."""
    block = torch.full(
        (anchor_tokens.shape[0], 1, width), config.mask_token_id, dtype=torch.int64, device=anchor_tokens.device
    )
    block[:, 0, 0] = anchor_tokens
    return block


def greedy_drafts(
    run_block,  # block ids [B, 1, width] at positions anchor .. anchor + width - 1 -> logits [B, 1, width, V]
    config: DrafterConfig,
    anchor_tokens: torch.Tensor,  # [B]
    num_drafts: int,
    width: int,  # block slots to run: >= num_drafts + 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """The one propose loop every drafter implementation shares (torch here, the ONNX graph in the adapter):
    greedy drafts [B, n] and the drafter's probability of each [B, n]. Single-pass kinds read the n drafts from
    one [anchor, MASK...] block; the autoregressive kind runs one pass per draft, writing each draft into the
    block (causal, so the unfilled tail never reaches the slot being read)."""
    block = anchor_block(config, anchor_tokens, width)
    if not behaviour_of(config.kind).autoregressive:
        return greedy_with_probability(run_block(block)[:, 0, 1 : num_drafts + 1])
    probabilities = []
    for slot in range(num_drafts):  # slot `slot` predicts the token after it
        token, probability = greedy_with_probability(run_block(block)[:, 0, slot : slot + 1])
        block[:, 0, slot + 1] = token[:, 0]
        probabilities.append(probability)
    return block[:, 0, 1 : num_drafts + 1], torch.cat(probabilities, dim=1)


def expected_weight_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes of a drafter with `config` (built on the meta device: no memory)."""
    with torch.device("meta"):
        drafter = Drafter(config)
    return {name: tuple(tensor.shape) for name, tensor in drafter.state_dict().items()}


class WeightCheck:
    """The drafter's weight names and shapes, checked as they stream past (an engine's loader) or all at once
    (check_weight_shapes): unknown names and wrong shapes are refused as seen, missing ones at the end. Engines'
    loaders would skip unknown names and leave missing weights uninitialised, silently."""

    def __init__(self, config: DrafterConfig, source: str) -> None:
        self.expected = expected_weight_shapes(config)
        self.source = source
        self.drafter = f"{config.kind} drafter with num_hidden_layers={config.num_hidden_layers}"
        self.seen: set[str] = set()

    def see(self, name: str, shape: tuple[int, ...]) -> None:
        if name not in self.expected:
            raise SpecError(
                f"{self.source}: weight {name!r} is not part of a {self.drafter} (expected names like "
                f"{sorted(self.expected)[:3]}); fix config.json or re-export the checkpoint with portable-spec"
            )
        if tuple(shape) != self.expected[name]:
            raise SpecError(
                f"{self.source}: weight {name} has shape {tuple(shape)}, config.json implies {self.expected[name]}; "
                "the config and weights come from different drafters"
            )
        self.seen.add(name)

    def finish(self) -> None:
        missing = sorted(set(self.expected) - self.seen)
        if missing:
            raise SpecError(
                f"{self.source}: lacks {len(missing)} weight(s) a {self.drafter} needs: {missing[:6]}; an engine "
                "would leave them uninitialised. fix: re-save the checkpoint with portable-spec"
            )


def check_weight_shapes(config: DrafterConfig, found: dict[str, tuple[int, ...]], source: str) -> None:
    """Refuse weights whose names or shapes are not exactly the drafter's (WeightCheck over all of them)."""
    check = WeightCheck(config, source)
    for name, shape in found.items():
        check.see(name, shape)
    check.finish()


def load_drafter(ckpt_dir: Path, dtype=torch.float32) -> Drafter:
    """Build a drafter from a checkpoint, not yet bound to a target (TargetModel.load_drafter binds); missing or
    unexpected weights fail here, naming them."""
    config, weights = load_drafter_files(ckpt_dir)
    check_weight_shapes(config, {name: tuple(tensor.shape) for name, tensor in weights.items()}, str(ckpt_dir))
    if config.draft_vocab_size is not None:  # every id it drafts must be a target token
        check_draft_vocab(target_ids_of(weights["d2t"]), config, f"{ckpt_dir}: d2t")
    drafter = Drafter(config)
    drafter.load_state_dict(weights)
    return drafter.to(dtype).eval()
