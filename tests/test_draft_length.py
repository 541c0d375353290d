"""The adaptive draft length (portable_spec/core/draft_length.py): the choice follows the cost model built from
measured costs and acceptance (fake clocks, nothing timed for real), 0 when no draft length pays, and output stays
plain greedy output whatever is chosen."""

from __future__ import annotations

import random

import pytest

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.draft_length import PRIOR_ROUNDS, DraftLengthPolicy, PassCosts, SlotAcceptance
from portable_spec.core.testing import tiny_drafter, tiny_target


def test_slot_acceptance_counts_reached_and_accepted_slots():
    slots = SlotAcceptance([0.5, 0.5, 0.5])
    slots.observe(3, 1)  # slot 1 accepted, slot 2 rejected, slot 3 never reached
    slots.observe(3, 3)
    assert slots.reached == [2, 2, 1] and slots.accepted == [2, 1, 1]
    rates = slots.rates()
    assert rates[0] == pytest.approx((PRIOR_ROUNDS * 0.5 + 2) / (PRIOR_ROUNDS + 2))
    assert rates[2] == pytest.approx((PRIOR_ROUNDS * 0.5 + 1) / (PRIOR_ROUNDS + 1))
    assert slots.expected_tokens(0) == 1
    assert slots.expected_tokens(2) == pytest.approx(1 + rates[0] + rates[0] * rates[1])


def test_costs_interpolate_between_measured_lengths():
    costs = PassCosts()
    costs.observe_verify(1, 0.07)
    assert costs.verify_seconds(4) is None  # one point draws no line
    costs.observe_verify(5, 0.15)
    assert costs.verify_seconds(3) == pytest.approx(0.11)
    assert costs.verify_seconds(7) == pytest.approx(0.19)  # extrapolated along the last two
    costs.observe_verify(5, 0.25)  # a running average, not the last value
    assert 0.15 < costs.verify_seconds(5) < 0.25


def _policy(verify: dict[int, float], draft: float, max_drafts: int = 4) -> DraftLengthPolicy:
    policy = DraftLengthPolicy(max_drafts)
    verify = {2: None, **verify}  # every exploration round done: the line has points enough
    if verify[2] is None:  # on the line between the ends
        verify[2] = verify[1] + (verify[5] - verify[1]) / 4
    for tokens, seconds in verify.items():
        policy.costs.observe_verify(tokens, seconds)
    policy.costs.observe_draft(draft)
    return policy


def _request(rates: list[float], rounds: int = 200) -> SlotAcceptance:
    """A request whose observed acceptance per slot is `rates` (the prior drowned by many rounds)."""
    request = SlotAcceptance([0.5] * len(rates))
    request.reached = [rounds] * len(rates)
    request.accepted = [round(rate * rounds) for rate in rates]
    return request


def test_the_policy_times_both_ends_first():
    policy = DraftLengthPolicy(4)
    requests = [policy.new_request()]
    assert policy.choose(requests) == 4  # nothing timed: the longest round
    policy.costs.observe_verify(5, 0.1)
    policy.costs.observe_draft(0.02)
    assert policy.choose(requests) == 0  # then a plain round
    policy.costs.observe_verify(1, 0.07)
    assert policy.choose(requests) == 1  # and one draft: where a short chain bends the line
    policy.costs.observe_verify(2, 0.075)
    assert policy.choose(requests) in range(5)


def test_a_new_request_starts_from_what_earlier_requests_accepted():
    policy = DraftLengthPolicy(2)
    first = policy.new_request()
    assert first.rates() == [0.5, 0.5]
    for _ in range(100):
        policy.observe(first, 2, 2)  # every draft accepted
    second = policy.new_request()
    assert second.rates()[0] > 0.9 and second.reached == [0, 0]


def test_plain_decoding_when_no_draft_length_pays():
    """Verify passes as dear per token as plain ones and a drafter that is rarely right: k = 0."""
    policy = _policy({1: 0.07, 5: 0.35}, draft=0.02)
    assert policy.choose([_request([0.3, 0.2, 0.1, 0.1])]) == 0


def test_the_longest_draft_when_verification_is_nearly_free_and_drafts_are_accepted():
    policy = _policy({1: 0.07, 5: 0.075}, draft=0.005)
    assert policy.choose([_request([0.9, 0.9, 0.9, 0.9])]) == 4


def test_the_choice_is_the_argmax_of_the_cost_model():
    policy = _policy({1: 0.07, 5: 0.15}, draft=0.01)
    request = _request([0.8, 0.5, 0.2, 0.1])
    rates = {k: policy.rate([request], k) for k in range(5)}
    best = max(rates, key=rates.get)
    assert 0 < best < 4  # this model's optimum is inside the range, so the test tells a wrong rule apart
    assert policy.choose([request]) == best


def test_a_batch_sums_its_requests_expected_tokens():
    policy = _policy({1: 0.07, 5: 0.15}, draft=0.01)
    good, bad = _request([0.95] * 4), _request([0.05] * 4)
    assert policy.rate([good, bad], 2) == pytest.approx(
        (good.expected_tokens(2) + bad.expected_tokens(2)) / (policy.costs.verify_seconds(3) + 0.01)
    )


def test_plain_rounds_are_interrupted_by_probes():
    policy = _policy({1: 0.07, 5: 0.35}, draft=0.02)
    policy.probe_every = 3
    requests = [_request([0.1] * 4)]
    assert [policy.choose(requests) for _ in range(5)] == [0, 0, 0, 1, 0]
    assert "k=0: 4, k=1: 1" in policy.summary() and "80% of 5 rounds plain" in policy.summary()


def test_an_autoregressive_drafter_pays_per_pass():
    single = _policy({1: 0.07, 5: 0.09}, draft=0.03)
    multi = _policy({1: 0.07, 5: 0.09}, draft=0.03)
    multi.passes = lambda k: k
    request = _request([0.9] * 4)
    assert multi.rate([request], 4) < single.rate([request], 4)


class FakeClock:
    """Seconds that depend on what was timed, through the decoder's own calls: each call advances by `step`."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("kind", ["parallel", "depth_causal", "autoregressive"])
def test_adaptive_output_is_plain_greedy_output(kind):
    target = tiny_target()
    drafter = tiny_drafter(target, kind)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 3]]
    fixed = GenerationConfig(max_new_tokens=16, num_draft_tokens=3)
    plain = SpeculativeDecoder(target, matmul_layout=None).generate(prompts, fixed).tokens
    adaptive = fixed.model_copy(update={"draft_length": "adaptive"})
    decoder = SpeculativeDecoder(target, drafter, matmul_layout=None, clock=FakeClock(0.01))
    output = decoder.generate(prompts, adaptive)
    assert output.tokens == plain
    policy = decoder.policies[3, len(prompts)]
    assert policy.chosen[:3] == [3, 0, 1]  # timed both ends and one draft first
    assert len(policy.chosen) == output.stats.rounds


def test_output_is_plain_greedy_whatever_lengths_are_chosen(monkeypatch):
    """Random draft counts each round (0 included): the tokens cannot change, only the rounds."""
    target = tiny_target()
    drafter = tiny_drafter(target, "depth_causal")
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    config = GenerationConfig(max_new_tokens=20, num_draft_tokens=5, draft_length="adaptive")
    plain = SpeculativeDecoder(target, matmul_layout=None).generate(prompts, config).tokens
    choices = random.Random(3)
    monkeypatch.setattr(DraftLengthPolicy, "_choose", lambda self, requests: choices.randint(0, self.max_drafts))
    decoder = SpeculativeDecoder(target, drafter, matmul_layout=None)
    output = decoder.generate(prompts, config)
    assert output.tokens == plain
    chosen = decoder.policies[5, 2].chosen
    assert 0 in chosen and len(set(chosen)) > 2


def test_drafting_rounds_are_interrupted_to_time_the_plain_pass_again():
    policy = _policy({1: 0.07, 5: 0.075}, draft=0.005)
    policy.refresh_every = 4
    requests = [_request([0.9] * 4)]
    assert [policy.choose(requests) for _ in range(6)] == [4, 4, 4, 4, 0, 4]
