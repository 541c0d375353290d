"""Counter-based randomness (Philox4x32-10): uniforms keyed by (seed, request, position, stream).

Any backend that asks for the same key gets the same numbers, on any device, in any batch order:
no global RNG state is read or advanced. torch exposes no keyed Philox, so the 10 rounds live here,
checked against the Random123 known-answer vectors in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF
_MUL = (0xD2511F53, 0xCD9E8D57)
_WEYL = (0x9E3779B9, 0xBB67AE85)

STREAM_ACCEPT = 0  # one uniform per draft position: the acceptance test
STREAM_SAMPLE = 1  # one uniform per (position, vocab id): the exponential race that samples a token
STREAM_DRAFT = 2  # one uniform per (position, vocab id): the race that samples a draft (sampling.DraftSampler)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    product = b * a  # < 2**64; int64 wraps but keeps every bit
    return (product >> 32) & _M32, product & _M32


def philox4x32(counter: torch.Tensor, key: torch.Tensor, rounds: int = 10) -> torch.Tensor:
    """counter [..., 4], key [..., 2] (int64 holding uint32) -> [..., 4] random uint32 as int64."""
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for round_index in range(rounds):
        if round_index:
            k0, k1 = (k0 + _WEYL[0]) & _M32, (k1 + _WEYL[1]) & _M32
        hi0, lo0 = _mulhilo(_MUL[0], c0)
        hi1, lo1 = _mulhilo(_MUL[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def keyed_uniforms(
    seed: int, request_ids: torch.Tensor, positions: torch.Tensor, stream: int, width: int
) -> torch.Tensor:
    """Uniforms in (0, 1): request_ids [B], positions [B, n] -> [B, n, width] float32.

    Key = (seed low 32 bits, request id); counter = (position, stream, lane block, seed high 32 bits).
    Values are (x >> 9 + 0.5) / 2**23: exact in float32 (24 significant bits) and never 0 or 1 — with 24
    random bits, 2**24 - 0.5 would round up to 1.0 and make the exponential race divide by -0.
    """
    device = positions.device
    blocks = (width + 3) // 4
    b, n = positions.shape
    counter = torch.empty(b, n, blocks, 4, dtype=torch.int64, device=device)
    counter[..., 0] = (positions.to(torch.int64) & _M32)[:, :, None]
    counter[..., 1] = stream
    counter[..., 2] = torch.arange(blocks, device=device)
    counter[..., 3] = (seed >> 32) & _M32
    key = torch.empty(b, n, blocks, 2, dtype=torch.int64, device=device)
    key[..., 0] = seed & _M32
    key[..., 1] = (request_ids.to(torch.int64) & _M32)[:, None, None]
    bits = philox4x32(counter, key).reshape(b, n, blocks * 4)[..., :width]
    return bits_to_uniform(bits)


def bits_to_uniform(bits: torch.Tensor) -> torch.Tensor:
    """uint32 (as int64) -> float32 in (0, 1): the top 23 bits, centred, so 0 and 1 are unreachable."""
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


@dataclass
class VerifyNoise:
    """The randomness one verification step consumes; an input, so backends can be compared exactly."""

    accept_uniform: torch.Tensor  # [B, n]: for the draft token at chain slot i+1
    sample_uniform: torch.Tensor  # [B, n+1, V]: exponential-race noise for the token decided at slot i

    @classmethod
    def unused(cls, batch: int, num_drafts: int, vocab_size: int, device: torch.device | str) -> "VerifyNoise":
        """Placeholder noise for an all-greedy batch, where p is one-hot and no uniform can change the result;
        on the logits' device (verify multiplies it with them)."""
        half = torch.full((1, 1, 1), 0.5, device=device)
        return cls(
            accept_uniform=half[0].expand(batch, num_drafts),
            sample_uniform=half.expand(batch, num_drafts + 1, vocab_size),
        )

    @classmethod
    def for_chain(
        cls, seed: int, request_ids: torch.Tensor, first_positions: torch.Tensor, num_drafts: int, vocab_size: int
    ) -> "VerifyNoise":
        """first_positions [B]: sequence position of the first token this step decides (anchor + 1)."""
        positions = first_positions[:, None] + torch.arange(num_drafts + 1, device=first_positions.device)
        return cls(
            accept_uniform=keyed_uniforms(seed, request_ids, positions[:, :num_drafts], STREAM_ACCEPT, 1)[..., 0],
            sample_uniform=keyed_uniforms(seed, request_ids, positions, STREAM_SAMPLE, vocab_size),
        )


def draft_uniforms(
    seed: int, request_ids: torch.Tensor, first_positions: torch.Tensor, num_drafts: int, vocab_size: int
) -> torch.Tensor:
    """[B, n, V] the noise a sampling drafter draws its drafts at positions first_positions [B] + 0..n-1 with; its own
    stream, independent of verification's. A position drafted again in a later round (after a rejection before it)
    draws the same numbers: no decision was made from them, so they are still independent of every token emitted."""
    positions = first_positions[:, None] + torch.arange(num_drafts, device=first_positions.device)
    return keyed_uniforms(seed, request_ids, positions, STREAM_DRAFT, vocab_size)
