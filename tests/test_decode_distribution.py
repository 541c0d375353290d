"""End-to-end losslessness at temperature > 0: tokens sampled by the speculative loop follow the target's own
distribution. Vocabulary 16 makes the exact joint of two generated tokens computable (256 cells)."""

import pytest
import torch
from scipy.stats import chisquare

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.sampling import SamplingBatch, SamplingParams, target_probs
from portable_spec.core.testing import tiny_drafter, tiny_target

PROMPT, SAMPLES = [1, 2, 3], 12000
SAMPLING = SamplingParams(temperature=1.0, top_k=10)


def _exact_joint(target, sampling: SamplingParams) -> torch.Tensor:
    """P(x2, x3) = sum_x1 p(x1) p(x2 | x1) p(x3 | x1, x2), each p filtered as the verifier filters it."""
    vocab = target.config.vocab_size
    grid = torch.stack(torch.meshgrid(torch.arange(vocab), torch.arange(vocab), indexing="ij"), -1).view(
        -1, 2
    )  # (x1, x2)
    seqs = torch.cat((torch.tensor(PROMPT).expand(len(grid), -1), grid), dim=1)
    with torch.no_grad():
        logits = target.model(input_ids=seqs).logits[:, -3:]  # predicts x1, x2, x3
    probs = target_probs(logits, SamplingBatch.from_params([sampling] * len(grid)))
    p1 = probs[0, 0]
    p2 = probs[::vocab, 1]  # rows with x2 = 0 share the prefix (prompt, x1): [x1, x2]
    p3 = probs[:, 2].view(vocab, vocab, vocab)  # [x1, x2, x3]
    return torch.einsum("a,ab,abc->bc", p1, p2, p3).double()


def _chi_square_p(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    expected = expected_probs.flatten() * counts.sum()
    counts = counts.flatten().double()
    big = expected >= 5  # merge sparse cells into one bin so the chi-square approximation holds
    rest_observed, rest_expected = counts[~big].sum(), expected[~big].sum()
    if rest_expected == 0 and rest_observed > 0:
        return 0.0  # tokens the target cannot emit (p = 0) were emitted
    observed = torch.cat((counts[big], rest_observed[None])) if rest_expected > 0 else counts[big]
    wanted = torch.cat((expected[big], rest_expected[None])) if rest_expected > 0 else expected[big]
    return float(chisquare(observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()).pvalue)


# depth_causal drafts greedily (q one-hot); the sequential heads draw their drafts from their own q at T > 0 and
# verification uses that q (the ONNX proposer draws the same drafts: tests/test_onnx_backend.py)
KIND_OPTIONS = {
    "depth_causal": {},
    "dflash2": {"variant_options": {"selector_top_k": 4, "selector_rank": 8}},
    "dspark": {"variant_options": {"markov_rank": 8}},
    "domino": {"variant_options": {"emb_dim": 16, "gru_hidden_dim": 16}},
}


@pytest.fixture(scope="module", params=list(KIND_OPTIONS))
def sampled(request):
    target = tiny_target(vocab_size=16)
    drafter = tiny_drafter(target, request.param, block_size=4, **KIND_OPTIONS[request.param])
    decoder = SpeculativeDecoder(target, drafter)
    config = GenerationConfig(max_new_tokens=3, num_draft_tokens=2, seed=2026, sampling=SAMPLING)
    out = decoder.generate([PROMPT] * SAMPLES, config, request_ids=list(range(SAMPLES)))
    counts = torch.zeros(16, 16)
    for tokens in out.tokens:
        counts[tokens[1], tokens[2]] += 1
    return target, counts, out.stats


def test_sampled_tokens_follow_the_target_distribution(sampled):
    target, counts, stats = sampled
    emitted = stats.emitted_per_round  # drafts were both accepted and rejected: both verifier paths ran
    assert min(emitted) == 1 and max(emitted) >= 2 and sum(e > 1 for e in emitted) > 100
    assert _chi_square_p(counts, _exact_joint(target, SAMPLING)) > 1e-3


def test_the_check_has_power(sampled):
    """The same samples against a nearby distribution (T=1.8 instead of 1.0) are rejected."""
    target, counts, _ = sampled
    wrong = _exact_joint(target, SAMPLING.model_copy(update={"temperature": 1.8}))
    assert _chi_square_p(counts, wrong) < 1e-3
