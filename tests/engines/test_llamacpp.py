"""llama.cpp as an engine, for real: the pinned build (portable_spec/adapters/llamacpp/build.py) loads what
`export gguf` writes and decodes through its own DFlash runtime (run by .ci/llamacpp_tests.sh, marker llamacpp).

- the export equals llama.cpp's own converter wherever that converter can write the drafter (no draft vocabulary);
- SmolLM2 with the shipped parallel drafter (draft vocabulary: d2t + its own head rows), held-out prompts:
  speculative output equals llama.cpp's own plain greedy on the shipped Q4_1 target and on the F32 one; on the F32
  target (the reference's exact weights) every round's accepted count equals the reference's at the same block, and
  the first round's draft logits equal the reference drafter's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from portable_spec.adapters.llamacpp import build, engine
from portable_spec.adapters.llamacpp.gguf_export import DRAFTER_FILE, export_gguf

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.skipif(build.missing() is not None, reason=str(build.missing())),
]

PROMPTS = 6  # held-out SmolLM2 prompts
NEW_TOKENS = 48
N_MAX = 3  # a 4-slot block: the block the shipped SmolLM2 drafters are benchmarked at on CPU
# llama.cpp's draft-dflash always runs an (n_max + 1)-slot block, while the reference runs a bidirectional drafter's
# whole trained block and takes the first drafts (core/drafter.py propose_scored): only at n_max = block_size - 1
# do both compute the trained function, so acceptance is compared there
FULL_BLOCK_N_MAX = 15
# with F32 KV caches and no flash attention (engine.EXACT), ggml and torch draft logits agree to ~1e-5 through 30
# target layers and the drafter (SmolLM2, AMD EPYC; ~1e-2 with llama.cpp's default F16 caches); a wrong layer or
# head row is off by O(1)
LOGIT_ATOL, LOGIT_RTOL = 2e-4, 2e-4
TIE = 1e-3  # a draft slot whose best two logits are closer than this may pick either across runtimes


def _fields(path: Path) -> tuple[dict, dict]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    keys = {}
    for name, field in reader.fields.items():
        if not name.startswith(("GGUF.", "general.")):
            keys[name] = field.contents()
    return keys, {t.name: (t.tensor_type.name, np.asarray(t.data)) for t in reader.tensors}


def _fixture_drafter(tmp_path: Path, kind: str) -> Path:
    """The trained fixture drafter; a dflash2 re-saved with 8 selector candidates (its codebooks do not depend on
    top-k), the most b11434's lattice row fits at the fixture's width 256 (gguf_export.runtime_gap)."""
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    if kind != "dflash2":
        return fixtures.drafter_dir(kind)
    drafter = TargetModel.load(fixtures.target_dir()).load_drafter(fixtures.drafter_dir(kind))
    variant = drafter.config.variant.model_copy(update={"selector_top_k": 8})
    drafter.config = drafter.config.model_copy(update={"variant": variant})
    return drafter.save(tmp_path / "dflash2-top8")


@pytest.mark.parametrize("kind", ["parallel", "dflash2", "dspark"])
def test_export_equals_llamacpp_converter(tmp_path, kind):
    """A full-vocabulary drafter: llama.cpp's convert_hf_to_gguf.py can write it (a DFlash2 from the dflash_config
    keys z-lab writes, a DSpark from speculators' top-level ones: both in our config.json), and `export gguf` must
    write the same keys and bit-equal tensors (the fixture target's vocabulary copied from llama.cpp's own
    conversion)."""
    from portable_spec.core import fixtures

    drafter = _fixture_drafter(tmp_path, kind)
    target_gguf = engine.convert_target(fixtures.target_dir(), tmp_path / "target.gguf")
    theirs = tmp_path / "converter.gguf"
    command = [
        *("python", "-c", engine.CONVERT, str(build.source_dir()), str(drafter)),
        *("--outtype", "f32", "--target-model-dir", str(fixtures.target_dir()), "--outfile", str(theirs)),
    ]
    import subprocess

    subprocess.run(command, check=True, capture_output=True)
    ours = export_gguf(drafter, tmp_path / "ours", target_gguf, fixtures.target_dir())
    our_keys, our_tensors = _fields(ours / DRAFTER_FILE)
    their_keys, their_tensors = _fields(theirs)
    assert our_keys == their_keys
    assert sorted(our_tensors) == sorted(their_tensors)
    for name, (kind, data) in their_tensors.items():
        assert our_tensors[name][0] == kind, name
        assert np.array_equal(our_tensors[name][1], data), name


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from portable_spec.core import real_assets
    from portable_spec.core.real_target import KNOWN_TARGETS, fetch_target, gguf_path

    target_dir = fetch_target("smollm2")
    work = tmp_path_factory.mktemp("llamacpp-smollm2")
    q4 = gguf_path(KNOWN_TARGETS["smollm2"])
    f32 = engine.convert_target(target_dir, work / "smollm2-f32.gguf")
    drafter = real_assets.drafter_dir("parallel")
    drafts = {
        name: export_gguf(drafter, work / f"draft-{name}", gguf, target_dir) / DRAFTER_FILE
        for name, gguf in (("q4", q4), ("f32", f32))
    }
    assert json.loads((drafter / "config.json").read_text())["block_size"] == FULL_BLOCK_N_MAX + 1
    prompts = real_assets.heldout_prompts()[:PROMPTS]
    return target_dir, drafter, prompts, {"q4": q4, "f32": f32}, drafts


def _until_stop(tokens: list[int], stops: tuple[int, ...]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


@pytest.mark.parametrize("weights", ["q4", "f32"])
@pytest.mark.parametrize("n_max", [N_MAX, FULL_BLOCK_N_MAX])
def test_smollm2_speculative_equals_llamacpp_plain(smollm2, weights, n_max):
    _, _, prompts, targets, drafts = smollm2
    accepted = 0
    for prompt in prompts:
        plain = engine.run_harness(targets[weights], prompt, NEW_TOKENS)
        speculative = engine.run_harness(targets[weights], prompt, NEW_TOKENS, drafts[weights], n_max=n_max)
        assert speculative.tokens == plain.tokens
        assert all(len(draft) == n_max for draft in speculative.drafts)
        accepted += sum(speculative.accepted)
    assert accepted > 0  # the drafter runs as trained: it is right often enough to be accepted at all


def _rounds_by_anchor(accepted: list[int]) -> dict[int, tuple[int, int]]:
    """Output position each round drafts after (the first token comes from the prefill) -> (accepted, round)."""
    position, rounds = 1, {}
    for index, count in enumerate(accepted):
        rounds[position] = (count, index)
        position += count + 1
    return rounds


def test_smollm2_acceptance_and_first_drafts_equal_reference(smollm2):
    """Same tokens; every round drafted from the same anchor accepts as many drafts as the reference's, except
    where llama.cpp's drafter had a near-tie (best and second-best logits within TIE) at the first slot where the
    two disagree (ggml and torch round differently, and a tie can go either way). At the trained block
    (n_max = block_size - 1), the one both run; F32 caches, no flash attention."""
    from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
    from portable_spec.core.target import TargetModel

    target_dir, drafter_dir, prompts, targets, drafts = smollm2
    target = TargetModel.load(target_dir, tokenizer=True)
    drafter = target.load_drafter(drafter_dir)
    stops = (target.tokenizer.eos_token_id,)
    n_max = FULL_BLOCK_N_MAX
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, num_draft_tokens=n_max, stop_token_ids=stops)
    reference = SpeculativeDecoder(target, drafter).generate(prompts, config)
    compared = agreed = 0
    for i, prompt in enumerate(prompts):
        run = engine.run_harness(targets["f32"], prompt, NEW_TOKENS, drafts["f32"], n_max=n_max, exact=True)
        expected = reference.tokens[i]
        assert _until_stop(run.tokens, stops) == expected, f"prompt {i}: llama.cpp F32 greedy != reference greedy"
        ours, theirs = _rounds_by_anchor(run.accepted), _rounds_by_anchor(reference.stats.accepted_by_request[i])
        for anchor in sorted(set(ours) & set(theirs)):
            (count, index), (expected_count, _) = ours[anchor], theirs[anchor]
            compared += 1
            if count == expected_count:
                agreed += 1
                continue
            slot = min(count, expected_count)  # the first slot whose draft differs between the two
            assert run.margins[index][slot] < TIE, (
                f"prompt {i}, round {index} (anchor {anchor}): llama.cpp accepts {count}, the reference "
                f"{expected_count}, and its draft at slot {slot} is no tie (margin {run.margins[index][slot]:.4f})"
            )
        # first round: context = the prompt's features, block = [first token, mask x n_max]
        ids = torch.tensor([prompt])
        positions = torch.arange(len(prompt))[None]
        with torch.no_grad():
            valid = torch.ones_like(ids, dtype=torch.bool)
            _, features = target.forward(ids, positions, valid, target.new_cache(), drafter.config.target_layer_ids)
            context = drafter.context_kv(features, positions)
            block = torch.tensor([[[expected[0]] + [drafter.config.mask_token_id] * n_max]])
            block_positions = (len(prompt) + torch.arange(n_max + 1))[None, None]
            mask = valid[:, None, :].expand(-1, n_max + 1, -1)
            logits = drafter.block_logits(block, block_positions, context, mask, positions).float()[0, 0]
        for slot, top in enumerate(run.first_draft_logits):
            ids_, values = zip(*top)
            ours_logits = logits[slot + 1, list(ids_)]
            assert torch.allclose(ours_logits, torch.tensor(values), atol=LOGIT_ATOL, rtol=LOGIT_RTOL), (
                f"prompt {i} slot {slot}"
            )
            if run.margins[0][slot] >= TIE:
                assert int(logits[slot + 1].argmax()) == ids_[0], f"prompt {i} slot {slot}"
    assert compared >= PROMPTS * 5 and agreed >= 0.95 * compared, (agreed, compared)


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_fixture_sequential_heads_accept_what_the_reference_accepts(tmp_path, kind):
    """llama.cpp's own DFlash2 (its selector lattice, walked on the CPU) and DSpark (its in-graph greedy Markov
    chain) on the trained fixtures, a whole block per round: every request's tokens and every round's accepted
    count equal the reference's, which accepts drafts there."""
    from portable_spec.adapters.llamacpp.backend import LlamaCppBackend
    from portable_spec.core import fixtures
    from portable_spec.core.backends import ReferenceBackend
    from portable_spec.core.decode import GenerationConfig
    from portable_spec.core.spec import read_config

    drafter = _fixture_drafter(tmp_path, kind)
    prompts = [prompt[:40] for prompt in fixtures.heldout_prompts()[:3]]
    config = GenerationConfig(max_new_tokens=32, num_draft_tokens=read_config(drafter).max_draft_tokens)
    expected = ReferenceBackend().acceptance(fixtures.target_dir(), drafter, prompts, config)
    actual = LlamaCppBackend().acceptance(fixtures.target_dir(), drafter, prompts, config)
    assert sum(expected.accepted_per_position) > 0
    assert actual.tokens == expected.tokens
    assert actual.accepted_by_request == expected.accepted_by_request
