"""Verifier unit cases; the full golden vectors and distribution tests live in portable_spec/conformance/."""

import pytest
import torch

from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, SamplingParams, target_probs
from portable_spec.core.verify import verify

GREEDY = SamplingParams()


def _batch(params, n):
    return SamplingBatch.from_params([params] * n)


def _noise(batch, n, vocab, seed=0):
    return VerifyNoise.for_chain(seed, torch.arange(batch), torch.zeros(batch, dtype=torch.int64), n, vocab)


def _logits_preferring(tokens, vocab):
    """[B, n+1, V] logits whose argmax at slot i is tokens[b][i]."""
    logits = torch.zeros(len(tokens), len(tokens[0]), vocab)
    for b, row in enumerate(tokens):
        for i, t in enumerate(row):
            logits[b, i, t] = 5.0
    return logits


def test_greedy_prefix_and_next_token():
    logits = _logits_preferring([[4, 5, 6, 7], [4, 5, 6, 7], [4, 5, 6, 7]], 10)
    drafts = torch.tensor([[4, 5, 6], [4, 9, 6], [1, 5, 6]])
    out = verify(logits, drafts, _batch(GREEDY, 3), _noise(3, 3, 10))
    assert out.accepted_len.tolist() == [3, 1, 0]
    assert out.next_token.tolist() == [7, 5, 4]  # bonus, recovered, recovered
    assert out.output_tokens.tolist() == [[4, 5, 6, 7], [4, 5, -1, -1], [4, -1, -1, -1]]


def test_greedy_tie_takes_first_index():
    logits = torch.zeros(1, 1, 6)
    logits[0, 0, [2, 4]] = 3.0
    out = verify(logits, torch.zeros(1, 0, dtype=torch.int64), _batch(GREEDY, 1), _noise(1, 0, 6))
    assert out.next_token.tolist() == [2]


def test_ragged_num_drafts_ignores_padding():
    logits = _logits_preferring([[4, 5, 6, 7], [4, 5, 6, 7]], 10)
    drafts = torch.tensor([[4, 5, 6], [4, 5, 0]])
    out = verify(logits, drafts, _batch(GREEDY, 2), _noise(2, 3, 10), num_drafts=torch.tensor([3, 2]))
    assert out.accepted_len.tolist() == [3, 2]
    assert out.next_token.tolist() == [7, 6]  # request 1's bonus comes from slot 2, not slot 3


def test_sampling_rejects_zero_probability_draft_and_never_emits_it():
    logits = torch.full((1, 2, 8), -1e9)
    logits[0, :, :3] = 0.0  # p uniform over {0, 1, 2}
    for seed in range(50):
        out = verify(logits, torch.tensor([[7]]), _batch(SamplingParams(temperature=1.0), 1), _noise(1, 1, 8, seed))
        assert out.accepted_len.item() == 0 and out.next_token.item() in (0, 1, 2)


def test_sampling_accepts_certain_draft():
    logits = torch.full((1, 2, 8), -1e9)
    logits[0, 0, 3] = 0.0
    out = verify(logits, torch.tensor([[3]]), _batch(SamplingParams(temperature=0.7), 1), _noise(1, 1, 8))
    assert out.accepted_len.item() == 1


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0, top_k=3), SamplingParams(temperature=1.0, top_p=0.5)]
)
def test_filters_shrink_support(params):
    logits = torch.tensor([[[4.0, 3.0, 2.0, 1.0, 0.0]]])
    probs = target_probs(logits, _batch(params, 1))[0, 0]
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    support = (probs > 0).nonzero().flatten().tolist()
    assert support == ([0, 1, 2] if params.top_k else [0])  # p(0) = 0.64 >= top_p alone


def test_nan_logits_are_refused():
    logits = torch.zeros(2, 2, 5)
    logits[1, 1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"NaN \(request 1, chain slot 1\)"):
        verify(logits, torch.zeros(2, 1, dtype=torch.int64), _batch(GREEDY, 2), _noise(2, 1, 5))


def test_wrong_logits_shape_is_refused():
    with pytest.raises(ValueError, match="score the anchor and every draft token"):
        verify(torch.zeros(1, 2, 5), torch.zeros(1, 2, dtype=torch.int64), _batch(GREEDY, 1), _noise(1, 2, 5))


def test_draft_with_zero_draft_probability_is_rejected():
    """q(d) = 0 and p(d) = 0 (top-k 2 cut d out of both): u * q <= p holds, yet d must never be accepted."""
    logits = torch.zeros(1, 2, 6)
    logits[0, :, :2] = 4.0  # top-k 2 keeps {0, 1}; token 5 has p = 0
    draft_probs = torch.zeros(1, 1, 6)
    draft_probs[0, 0, :2] = 0.5  # the drafter's own q gives token 5 zero mass too
    for seed in range(20):
        out = verify(
            logits,
            torch.tensor([[5]]),
            _batch(SamplingParams(temperature=1.0, top_k=2), 1),
            _noise(1, 1, 6, seed),
            draft_probs=draft_probs,
        )
        assert out.accepted_len.item() == 0 and out.next_token.item() in (0, 1)
