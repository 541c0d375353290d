"""The shipped, trained fixtures: greedy speculative decoding is lossless on >= 50 held-out prompts for every
drafter kind, batch 1 and batch 4; the trained drafters actually accept tokens."""

import pytest

from portable_spec.core import fixtures
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import VARIANT_KINDS
from portable_spec.core.target import TargetModel

NUM_PROMPTS, NEW_TOKENS = 52, 24


@pytest.fixture(scope="module")
def target():
    return TargetModel.load(fixtures.target_dir())


@pytest.fixture(scope="module")
def reference(target):
    prompts = fixtures.heldout_prompts()[:NUM_PROMPTS]
    decoder = SpeculativeDecoder(target)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS)
    return [decoder.generate([p], config).tokens[0] for p in prompts]


def test_fixture_prompts_are_held_out_and_enough():
    prompts = fixtures.heldout_prompts()
    assert len(prompts) >= NUM_PROMPTS and all(len(p) >= 16 for p in prompts)
    assert fixtures.manifest()["heldout_tokens"] > 0


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("kind", VARIANT_KINDS)
def test_greedy_lossless_on_heldout_prompts(target, reference, kind, batch_size):
    decoder = SpeculativeDecoder(target, target.load_drafter(fixtures.drafter_dir(kind)))
    prompts = fixtures.heldout_prompts()[:NUM_PROMPTS]
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, num_draft_tokens=7)
    outputs, emitted = [], []
    for start in range(0, NUM_PROMPTS, batch_size):
        out = decoder.generate(prompts[start : start + batch_size], config)
        outputs += out.tokens
        emitted += out.stats.emitted_per_round
    assert outputs == reference
    assert sum(emitted) / len(emitted) > 1.3  # trained drafters accept tokens: this is not a random model
