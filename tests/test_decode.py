"""The reference loop is lossless: greedy output equals autoregressive output token for token, batched or not,
including when acceptance is ragged across the batch; sampled output is reproducible under a fixed seed."""

import pytest
import torch

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import SpecError
from portable_spec.core.testing import tiny_drafter, tiny_target

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17], [3], [40, 41, 42]]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def reference(target):
    config = GenerationConfig(max_new_tokens=24)
    return [SpeculativeDecoder(target).generate([p], config).tokens[0] for p in PROMPTS]


class OracleProposer:
    """Test double for the proposer seam: drafts the known greedy continuation, wrong at a chosen offset,
    so acceptance lengths differ across the batch and every cache path (holes, crop) is exercised."""

    def __init__(self, config, prompts, continuations, wrong_offset):
        self.config = config
        self.sequences = [p + c for p, c in zip(prompts, continuations)]
        self.wrong_offset = wrong_offset  # (row, anchor_pos) -> draft index to corrupt (or None)

    def begin(self, features, positions):
        return None

    def extend(self, state, features, positions):
        return None

    def crop(self, state, length):
        return None

    def propose(self, state, valid, anchor_tokens, anchor_positions, num_drafts):
        drafts = torch.zeros(len(anchor_tokens), num_drafts, dtype=torch.int64)
        for row, pos in enumerate(anchor_positions.tolist()):
            future = self.sequences[row][pos + 1 : pos + 1 + num_drafts]
            future += [0] * (num_drafts - len(future))
            drafts[row] = torch.tensor(future)
            wrong = self.wrong_offset(row, pos)
            if wrong is not None and wrong < num_drafts:
                drafts[row, wrong] = (drafts[row, wrong] + 1) % self.config.vocab_size
        return drafts

    def passes_per_round(self, num_drafts):
        return 1


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("kind", ["parallel", "depth_causal", "autoregressive"])
def test_greedy_output_equals_autoregressive(target, reference, kind, batch_size):
    drafter = tiny_drafter(target, kind)
    decoder = SpeculativeDecoder(target, drafter)
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=5)
    outputs = []
    for start in range(0, len(PROMPTS), batch_size):
        outputs += decoder.generate(PROMPTS[start : start + batch_size], config).tokens
    assert outputs == reference


@pytest.mark.parametrize("num_drafts", [1, 3, 7])
def test_greedy_lossless_under_ragged_acceptance(target, reference, num_drafts):
    def wrong(row, pos):
        return (row + pos) % (num_drafts + 2)  # sometimes all accepted, sometimes first rejected

    proposer = OracleProposer(tiny_drafter(target, "depth_causal").config, PROMPTS, reference, wrong)
    out = SpeculativeDecoder(target, proposer).generate(
        PROMPTS, GenerationConfig(max_new_tokens=24, num_draft_tokens=num_drafts)
    )
    assert out.tokens == reference
    emitted = out.stats.emitted_per_round
    assert len(set(emitted)) > 1 and max(emitted) == num_drafts + 1  # ragged, with full accepts
    assert out.stats.acceptance_length > 1.5


def test_stop_tokens_end_a_request_early(target, reference):
    stop = reference[0][5]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=4, stop_token_ids=(stop,))
    out = SpeculativeDecoder(target, tiny_drafter(target, "parallel")).generate(PROMPTS, config).tokens
    for row, expected in enumerate(reference):
        cut = expected.index(stop) + 1 if stop in expected else len(expected)
        assert out[row] == expected[:cut]
    assert len(out[0]) == reference[0].index(stop) + 1


def test_max_new_tokens_is_exact(target):
    for limit in (1, 2, 9):
        out = SpeculativeDecoder(target, tiny_drafter(target, "parallel")).generate(
            PROMPTS, GenerationConfig(max_new_tokens=limit, num_draft_tokens=7)
        )
        assert [len(t) for t in out.tokens] == [limit] * len(PROMPTS)


def test_sampled_output_is_reproducible_and_keyed_per_request(target):
    decoder = SpeculativeDecoder(target, tiny_drafter(target, "depth_causal"))
    config = GenerationConfig(
        max_new_tokens=16, num_draft_tokens=3, seed=11, sampling={"temperature": 1.0, "top_k": 50, "top_p": 0.95}
    )
    first = decoder.generate(PROMPTS, config).tokens
    assert decoder.generate(PROMPTS, config).tokens == first
    alone = decoder.generate([PROMPTS[2]], config, request_ids=[2]).tokens[0]
    assert alone == first[2]  # request 2's tokens do not depend on its batch neighbours
    other_seed = decoder.generate(PROMPTS, config.model_copy(update={"seed": 12})).tokens
    assert other_seed != first


def test_bad_requests_fail_before_decoding(target):
    decoder = SpeculativeDecoder(target, tiny_drafter(target, "parallel", block_size=4))
    with pytest.raises(SpecError, match="prompts is empty"):
        decoder.generate([], GenerationConfig())
    with pytest.raises(SpecError, match=r"prompts\[1\] is empty"):
        decoder.generate([[1], []], GenerationConfig())
    with pytest.raises(SpecError, match="outside"):
        decoder.generate([[1, 9999]], GenerationConfig())
    with pytest.raises(SpecError, match="num_draft_tokens=5 does not fit block_size=4"):
        decoder.generate([[1]], GenerationConfig(num_draft_tokens=5))
