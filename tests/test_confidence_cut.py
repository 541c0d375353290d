"""Confidence-cut rounds: the target verifies only the draft prefix the drafter is confident in. Output stays the
plain greedy output token for token; fewer draft slots are scored (on the trained fixtures, where confidence means
something)."""

import pytest

from portable_spec.core import fixtures
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import VARIANT_KINDS
from portable_spec.core.target import TargetModel

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return TargetModel.load(fixtures.target_dir())


@pytest.mark.parametrize("kind", VARIANT_KINDS)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_confidence_cut_stays_lossless_and_verifies_fewer_drafts(target, kind, batch_size):
    drafter = target.load_drafter(fixtures.drafter_dir(kind))
    prompts = fixtures.heldout_prompts()[:batch_size]
    full = GenerationConfig(max_new_tokens=24, num_draft_tokens=7)
    cut = full.model_copy(update={"draft_confidence": 0.3})
    plain = SpeculativeDecoder(target).generate(prompts, full).tokens
    out_full = SpeculativeDecoder(target, drafter).generate(prompts, full)
    out_cut = SpeculativeDecoder(target, drafter).generate(prompts, cut)
    assert out_cut.tokens == out_full.tokens == plain
    assert out_full.stats.drafts_verified == 7 * len(out_full.stats.emitted_per_round)
    assert out_cut.stats.drafts_verified < out_full.stats.drafts_verified
