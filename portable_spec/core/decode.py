"""The reference decode loop: speculative (any drafter) or plain autoregressive, batch > 1, ragged acceptance.

One round: the drafter proposes n tokens after each request's anchor (its last emitted token); the target
scores [anchor, drafts] in one pass; `verify` picks the accepted prefix and the next token; accepted slots
stay valid in both caches, rejected ones become masked holes, and the unused tail is cropped. With
`draft_length="adaptive"` n is chosen each round from measured costs and acceptance (draft_length.py), 0 included;
linear layers run in the matmul layout measured fastest on this machine (matmul_layout.py).
"""

from __future__ import annotations

import math
import time
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from portable_spec.core.dispatch import verify_op  # the torch twin (== verify) off CUDA, the fused Triton kernel on it
from portable_spec.core.draft_length import DraftLengthPolicy, SlotAcceptance
from portable_spec.core.drafter import Drafter
from portable_spec.core.matmul_layout import LayoutTable, measured_linears
from portable_spec.core.noise import VerifyNoise, draft_uniforms
from portable_spec.core.proposer import DraftProposer, TorchProposer
from portable_spec.core.sampling import MIN_TEMPERATURE, DraftSampler, SamplingBatch, SamplingParams
from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel
from portable_spec.core.verify import VerifyResult


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(64, ge=1, strict=True, description="Tokens to generate per request, at most.")
    num_draft_tokens: int = Field(7, ge=1, strict=True, description="Draft tokens per round (block_size - 1 at most).")
    stop_token_ids: tuple[Annotated[int, Field(ge=0, strict=True)], ...] = Field(
        (), description="Generation ends after emitting any of these (token ids of the target's vocabulary)."
    )
    draft_confidence: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Verify only the draft prefix whose drafter probabilities multiply to at "
        "least this (at least one draft); 0 verifies every draft. Lossless for any value: verification is unchanged.",
    )
    draft_length: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="fixed: num_draft_tokens every round; adaptive: each round the count (0 = plain decoding .. "
        "num_draft_tokens) with the most expected tokens per second, from this machine's measured pass costs and "
        "each request's measured acceptance. Lossless either way.",
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    seed: int = Field(0, ge=0, lt=2**64, description="Keys the counter-based noise with each request id.")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer read after it measures the work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


MAX_REQUEST_ID = 2**32  # the noise key holds 32 bits of request id (noise.keyed_uniforms)


def check_request_ids(request_ids: list[int], batch: int) -> None:
    """One integer id per prompt in [0, 2**32): larger ids would alias (2**40 would draw request 0's samples)."""
    if len(request_ids) != batch:
        raise SpecError(f"request_ids has {len(request_ids)} entries for {batch} prompts; give one per prompt")
    for index, rid in enumerate(request_ids):
        if isinstance(rid, bool) or not isinstance(rid, (int, np.integer)) or not 0 <= rid < MAX_REQUEST_ID:
            raise SpecError(
                f"request_ids[{index}]={rid!r}: request ids are integers in [0, 2**32) (the noise key "
                "holds 32 bits); map larger ids into that range"
            )


@dataclass
class DecodeStats:
    rounds: int = 0  # target verification passes (excluding prefill)
    drafter_passes: int = 0
    drafts_verified: int = 0  # draft slots the target scored, over active requests (< rounds x n when cut)
    accepted_by_request: list[list[int]] = field(default_factory=list)  # per request, accepted drafts per round
    seconds: float = 0.0

    @property
    def emitted_per_round(self) -> list[int]:
        """Tokens emitted (accepted + 1) in every round of every active request, request by request."""
        return [accepted + 1 for request in self.accepted_by_request for accepted in request]

    @property
    def acceptance_length(self) -> float:
        """tau: mean tokens emitted per verification round and request."""
        return sum(self.emitted_per_round) / max(len(self.emitted_per_round), 1)


def acceptance_by_position(emitted_per_round: list[int], num_drafts: int) -> list[float]:
    """Conditional acceptance per draft slot from per-round emitted counts (accepted + 1)."""
    accepted = torch.tensor(emitted_per_round, dtype=torch.int64) - 1
    rates = []
    for slot in range(1, num_drafts + 1):
        reached = int((accepted >= slot - 1).sum())
        rates.append(float((accepted >= slot).sum()) / reached if reached else math.nan)
    return rates


@dataclass
class GenerationOutput:
    tokens: list[list[int]]
    stats: DecodeStats


@dataclass
class _SlotLayout:
    """Which cache slots hold real tokens, and their sequence positions; shared by target and drafter caches."""

    valid: torch.Tensor  # [B, S] bool
    positions: torch.Tensor  # [B, S] int64

    def append(self, valid: torch.Tensor, positions: torch.Tensor) -> None:
        self.valid = torch.cat((self.valid, valid), dim=1)
        self.positions = torch.cat((self.positions, positions), dim=1)

    def live_length(self) -> int:
        """Slots up to the last valid one in any row; everything after is dead in every row."""
        slots = torch.arange(1, self.valid.shape[1] + 1, device=self.valid.device)
        return int((slots * self.valid).max())

    def crop(self, length: int) -> None:
        self.valid, self.positions = self.valid[:, :length], self.positions[:, :length]


@dataclass
class _DecodeState:
    """What one generate call carries from round to round."""

    config: GenerationConfig
    sampling: SamplingBatch
    request_ids: torch.Tensor  # [B]
    layout: _SlotLayout
    cache: object  # the target's KV cache
    context: object  # the proposer's context state (None without a drafter)
    anchor: torch.Tensor  # [B] each request's last emitted token
    anchor_pos: torch.Tensor  # [B] its sequence position
    outputs: list[list[int]]
    active: torch.Tensor  # [B] bool: still generating
    stats: DecodeStats = field(default_factory=DecodeStats)
    acceptance: list[SlotAcceptance] | None = None  # per request, with draft_length="adaptive"
    # target features of plain rounds not yet in the drafter's context: [(features [B, 1, F], positions [B, 1])];
    # added in one pass before the next draft, so a round that drafts nothing costs what plain decoding costs
    pending: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class SpeculativeDecoder:
    """Reference loop; with no drafter it decodes autoregressively through the same verify step."""

    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter | DraftProposer | None = None,
        matmul_layout: LayoutTable | Literal["measured"] | None = "measured",
        clock=time.perf_counter,
    ) -> None:
        """matmul_layout: the layout table the target's and drafter's linear layers follow while generating
        ("measured": this machine's, matmul_layout.py; None: torch's F.linear everywhere). clock: what rounds are
        timed with for draft_length="adaptive" (its policies, one per draft-count limit and batch size, live as
        long as the decoder, so what one generate call measured serves the next)."""
        self.target = target
        self.matmul_layout = LayoutTable.load(target.device) if matmul_layout == "measured" else matmul_layout
        self.clock = clock
        self.policies: dict[tuple[int, int], DraftLengthPolicy] = {}
        if isinstance(drafter, Drafter):
            target.require_bound(drafter)  # checked as a pair once, by TargetModel.bind; not again here
            drafter = TorchProposer(drafter)
        self.proposer: DraftProposer | None = drafter
        self.layer_ids = self.proposer.config.target_layer_ids if self.proposer is not None else None

    def _check_prompts(self, prompts: list[list[int]], config: GenerationConfig) -> None:
        if not isinstance(prompts, (list, tuple)):
            hint = "tokenize the text first" if isinstance(prompts, str) else "a tensor or array: prompts.tolist()"
            raise SpecError(f"prompts is a {type(prompts).__name__}; pass a list of token-id lists ({hint})")
        for index, prompt in enumerate(prompts):
            if not isinstance(prompt, (list, tuple)):
                hint = (
                    "text: tokenize it with the target's tokenizer"
                    if isinstance(prompt, str)
                    else "a tensor or array: pass prompt.tolist()"
                )
                raise SpecError(f"prompts[{index}] is a {type(prompt).__name__}, not a list of token ids ({hint})")
        if not prompts:
            raise SpecError("prompts is empty: pass at least one prompt")
        vocab = self.target.vocab_size
        outside = [t for t in config.stop_token_ids if t >= vocab]
        if outside:
            raise SpecError(
                f"stop_token_ids={list(config.stop_token_ids)}: {outside} are outside the target's "
                f"vocabulary [0, {vocab}) and can never be emitted; use the tokenizer's ids"
            )
        limit = getattr(self.target.config, "max_position_embeddings", None)
        drafts = config.num_draft_tokens if self.proposer is not None else 0
        longest = max(len(p) for p in prompts)
        if limit is not None and longest + config.max_new_tokens + drafts > limit:
            raise SpecError(
                f"the longest prompt ({longest} tokens) + max_new_tokens={config.max_new_tokens} + "
                f"{drafts} draft slots reach past the target's max_position_embeddings={limit}; shorten "
                f"the prompt or lower max_new_tokens to {max(limit - longest - drafts, 0)}"
            )
        for index, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise SpecError(f"prompts[{index}] is empty: every prompt needs at least one token (e.g. BOS)")
            bad = next((t for t in prompt if isinstance(t, bool) or not isinstance(t, (int, np.integer))), None)
            if bad is not None:  # 3.7 would be truncated to 3 by torch.tensor: refuse instead
                raise SpecError(
                    f"prompts[{index}] holds {bad!r} ({type(bad).__name__}); token ids are integers "
                    "from the target's tokenizer"
                )
            if min(prompt) < 0 or max(prompt) >= vocab:
                raise SpecError(
                    f"prompts[{index}] has token ids outside [0, {vocab}); tokenize with the target's tokenizer"
                )

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], config: GenerationConfig, request_ids: list[int] | None = None
    ) -> GenerationOutput:
        """request_ids key each request's noise (default 0..B-1): the same id, seed and prompt sample the same
        tokens whatever batch they are in. Inputs are checked here, once; the rounds check nothing."""
        self._check_prompts(prompts, config)
        if self.proposer is not None:
            self.proposer.config.check_num_draft_tokens(config.num_draft_tokens)
        if request_ids is not None:
            check_request_ids(request_ids, len(prompts))
        with self._layout():
            synchronize(self.target.device)
            start = time.perf_counter()
            state = self._prefill(prompts, config, request_ids)
            while bool(state.active.any()):
                self._commit(state, *self._round(state))
            synchronize(self.target.device)
        state.stats.seconds = time.perf_counter() - start
        return GenerationOutput(tokens=state.outputs, stats=state.stats)

    def policy(self, config: GenerationConfig, batch: int) -> DraftLengthPolicy | None:
        """The adaptive draft-length policy for this limit and batch size (None: fixed length, or no drafter)."""
        if config.draft_length != "adaptive" or self.proposer is None:
            return None
        key = (config.num_draft_tokens, batch)
        if key not in self.policies:
            self.policies[key] = DraftLengthPolicy(config.num_draft_tokens, self.proposer.passes_per_round)
        return self.policies[key]

    def _layout(self) -> AbstractContextManager:
        """The measured matmul layout for the target's and the proposer's linears (matmul_layout.py)."""
        if self.matmul_layout is None:
            return nullcontext()
        stack = ExitStack()
        stack.enter_context(measured_linears(self.matmul_layout, self.target.model))
        if self.proposer is not None and hasattr(self.proposer, "decode_layout"):
            stack.enter_context(self.proposer.decode_layout(self.matmul_layout))
        return stack

    def _prefill(self, prompts, config: GenerationConfig, request_ids: list[int] | None) -> "_DecodeState":
        """One target pass over the packed prompts: the caches, the drafter context and each request's first token."""
        device, batch = self.target.device, len(prompts)
        ids = torch.tensor(request_ids if request_ids is not None else range(batch), device=device)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        width = int(lengths.max())
        input_ids = torch.zeros(batch, width, dtype=torch.int64, device=device)
        for row, prompt in enumerate(prompts):
            input_ids[row, : len(prompt)] = torch.tensor(prompt, device=device)
        slots = torch.arange(width, device=device).expand(batch, -1)
        layout = _SlotLayout(valid=slots < lengths[:, None], positions=slots.clone())
        cache = self.target.new_cache()
        logits, features = self.target.forward(input_ids, slots, layout.valid, cache, self.layer_ids)
        context = self.proposer.begin(features, slots) if self.proposer is not None else None
        sampling = SamplingBatch.from_params([config.sampling] * batch, device)
        last = logits[torch.arange(batch, device=device), lengths - 1][:, None]
        noise = self._noise(config, ids, lengths, 0, last.shape[-1])
        anchor = verify_op(last, last.new_zeros(batch, 0, dtype=torch.int64), sampling, noise).next_token
        outputs = [[int(t)] for t in anchor]
        active = torch.tensor([not self._finish(out, config) for out in outputs], device=device)
        stats = DecodeStats(accepted_by_request=[[] for _ in prompts])
        policy = self.policy(config, batch)
        acceptance = [policy.new_request() for _ in prompts] if policy is not None else None
        return _DecodeState(
            config, sampling, ids, layout, cache, context, anchor, lengths.clone(), outputs, active, stats, acceptance
        )

    def _round(self, state: "_DecodeState"):
        """Draft after each anchor, score [anchor, drafts] in one target pass, verify: (result, chain positions,
        the chain's features, per-row draft counts or None)."""
        device, config = self.target.device, state.config
        drafts, round_drafts = state.anchor.new_zeros(len(state.anchor), 0), None
        policy = self.policy(config, len(state.anchor))
        num_drafts = config.num_draft_tokens
        if policy is not None:
            num_drafts = policy.choose([state.acceptance[row] for row in state.active.nonzero()[:, 0].tolist()])
        drafting = self.proposer is not None and num_drafts > 0
        if drafting:
            self._catch_up(state)  # untimed: its cost belongs to the plain rounds it catches up on
        measured = self._measured_count()
        start = self._tick() if policy is not None else 0.0
        draft_probs = None
        if drafting:
            drafts, round_drafts, draft_probs = self._propose(
                self.proposer,
                state.context,
                state.layout.valid,
                state.anchor,
                state.anchor_pos,
                num_drafts,
                config.draft_confidence,
                self._draft_sampler(state, num_drafts),
            )
            state.stats.drafter_passes += self.proposer.passes_per_round(num_drafts)
            if policy is not None:
                drafted = self._tick()
                if measured == self._measured_count():  # a round that timed layouts would skew the costs
                    policy.costs.observe_draft((drafted - start) / self.proposer.passes_per_round(num_drafts))
                start = drafted
        n = drafts.shape[1]
        chain = torch.cat((state.anchor[:, None], drafts), dim=1)  # [B, n+1]
        chain_pos = state.anchor_pos[:, None] + torch.arange(n + 1, device=device)
        mask = torch.cat((state.layout.valid, torch.ones_like(chain, dtype=torch.bool)), dim=1)
        logits, features = self.target.forward(chain, chain_pos, mask, state.cache, self.layer_ids)
        if policy is not None:
            seconds = self._tick() - start
            if measured == self._measured_count():
                policy.costs.observe_verify(n + 1, seconds)
        state.stats.rounds += 1
        noise = self._noise(config, state.request_ids, state.anchor_pos + 1, n, logits.shape[-1])
        return (
            verify_op(logits, drafts, state.sampling, noise, draft_probs, num_drafts=round_drafts),
            chain_pos,
            features,
            round_drafts,
        )

    def _commit(self, state: "_DecodeState", result: VerifyResult, chain_pos, features, round_drafts) -> None:
        """Keep the accepted slots in both caches (rejected ones become masked holes), emit the tokens, advance
        the anchors, and crop the tail no request uses."""
        n = chain_pos.shape[1] - 1
        kept = torch.arange(n + 1, device=chain_pos.device) <= result.accepted_len[:, None]
        state.layout.append(kept & state.active[:, None], chain_pos)
        if self.proposer is not None and n == 0 and state.acceptance is not None:
            state.pending.append((features, chain_pos))  # an adaptive plain round: the drafter catches up later
        elif self.proposer is not None:
            self._catch_up(state)
            state.context = self.proposer.extend(state.context, features, chain_pos)
        policy = self.policy(state.config, len(state.anchor))
        for row in state.active.nonzero()[:, 0].tolist():
            accepted = int(result.accepted_len[row])
            verified = int(round_drafts[row]) if round_drafts is not None else n
            if policy is not None:
                policy.observe(state.acceptance[row], verified, accepted)
            state.stats.accepted_by_request[row].append(accepted)
            state.stats.drafts_verified += verified
            state.outputs[row].extend(result.output_tokens[row, : accepted + 1].tolist())
            state.active[row] = not self._finish(state.outputs[row], state.config)
        state.anchor, state.anchor_pos = result.next_token, state.anchor_pos + result.accepted_len + 1
        live = state.layout.live_length()
        if live < state.layout.valid.shape[1]:
            state.cache.crop(live - state.layout.valid.shape[1])  # negative = drop that many from the end
        state.layout.crop(live)
        if self.proposer is not None and not state.pending:
            state.context = self.proposer.crop(state.context, live)

    def _catch_up(self, state: "_DecodeState") -> None:
        """Add the features of the plain rounds since the last draft to the drafter's context, in one pass, and cut
        it to the slots the caches still hold."""
        if not state.pending:
            return
        features = torch.cat([f for f, _ in state.pending], dim=1)
        positions = torch.cat([p for _, p in state.pending], dim=1)
        state.pending.clear()
        state.context = self.proposer.extend(state.context, features, positions)
        state.context = self.proposer.crop(state.context, state.layout.valid.shape[1])

    def _measured_count(self) -> int:
        return len(self.matmul_layout.measured) if self.matmul_layout is not None else 0

    def _tick(self) -> float:
        """The clock after the device's queued work (rounds are timed only for the adaptive policy)."""
        synchronize(self.target.device)
        return self.clock()

    def _draft_sampler(self, state: "_DecodeState", num_drafts: int) -> DraftSampler | None:
        """The sampler of a proposer that draws its drafts (proposer.py) when some request samples; else None."""
        sampling = state.sampling
        if not getattr(self.proposer, "samples_drafts", False) or not bool(
            (sampling.temperature >= MIN_TEMPERATURE).any()
        ):
            return None
        uniforms = draft_uniforms(
            state.config.seed, state.request_ids, state.anchor_pos + 1, num_drafts, self.target.vocab_size
        )
        return DraftSampler(sampling, uniforms)

    @staticmethod
    def _propose(proposer, context, valid, anchor, anchor_pos, num_drafts: int, confidence: float, sampler=None):
        """Drafts [B, n], when cut by confidence each row's draft count [B] (n = the longest row's), and the q [B, n, V]
        sampled drafts were drawn from (None: greedy drafts, q one-hot)."""
        q = None
        if sampler is not None:
            drafts, probability, q = proposer.propose_sampled(context, valid, anchor, anchor_pos, num_drafts, sampler)
            if confidence == 0:
                return drafts, None, q
        elif confidence == 0:
            return proposer.propose(context, valid, anchor, anchor_pos, num_drafts), None, None
        else:
            drafts, probability = proposer.propose_scored(context, valid, anchor, anchor_pos, num_drafts)
        confident = probability.cumprod(dim=1) >= confidence  # [B, n]
        per_row = confident.to(torch.int64).cumprod(dim=1).sum(dim=1).clamp(min=1)  # at least one draft
        longest = int(per_row.max())
        return drafts[:, :longest], per_row, None if q is None else q[:, :longest]

    @staticmethod
    def _noise(config: GenerationConfig, request_ids, first_positions, num_drafts: int, vocab: int) -> VerifyNoise:
        if config.sampling.temperature == 0:
            return VerifyNoise.unused(len(request_ids), num_drafts, vocab, request_ids.device)
        return VerifyNoise.for_chain(config.seed, request_ids, first_positions, num_drafts, vocab)

    @staticmethod
    def _finish(tokens: list[int], config: GenerationConfig) -> bool:
        """Truncate `tokens` in place at the first stop token or max_new_tokens; True when done."""
        for index, token in enumerate(tokens):
            if token in config.stop_token_ids:
                del tokens[index + 1 :]
                return True
        if len(tokens) >= config.max_new_tokens:
            del tokens[config.max_new_tokens :]
            return True
        return False
