"""The conformance checks, each defined once; pytest (test_backends.py) and `portable-spec conformance` run them.

A check takes a CheckContext and returns on success, raises CheckFailed with what differs, or CheckSkipped
with why it cannot run here. Verification is compared exactly (injected logits, drafts and noise); model
outputs to a tolerance; end-to-end tokens exactly, under greedy or seeded keyed sampling.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from portable_spec.adapters.upstream.importer import import_drafter
from portable_spec.conformance.distribution import ALPHA, DRAWS, SAMPLING, distribution_fits, two_sample_p_value
from portable_spec.conformance.golden import GOLDEN_DIR, case_paths, load_case, to_tensors
from portable_spec.conformance.upstream_layouts import UPSTREAM_LAYOUTS, write_portable_as_upstream
from portable_spec.conformance.widened import widened
from portable_spec.conformance.workspace import CheckSkipped, Workspace, trained_fixture
from portable_spec.core.backends import Acceptance, Backend, is_reference
from portable_spec.core.checkpoint import load_drafter_files, save_drafter
from portable_spec.core.decode import GenerationConfig
from portable_spec.core.sampling import SamplingParams
from portable_spec.core.spec import VARIANT_KINDS, DrafterConfig, read_config
from portable_spec.core.target import TargetModel
from portable_spec.core.testing import TINY_TARGET

TOLERANCE = 1e-4  # logits and features: backends differ by float rounding (~1e-6), a wrong layer by O(1)
TINY_GREEDY = GenerationConfig(max_new_tokens=24, num_draft_tokens=5)
TINY_SAMPLED = GenerationConfig(
    max_new_tokens=24,
    num_draft_tokens=5,
    seed=2**33 + 5,
    sampling=SamplingParams(temperature=0.8, top_k=40, top_p=0.95),
)
HELDOUT_GREEDY = GenerationConfig(max_new_tokens=32, num_draft_tokens=7)
HELDOUT_LENGTHS = (48, 40, 33, 45)  # ragged batch cut from the first held-out prompts
SAMPLES = 1000  # independent requests per arm of the distribution checks
DISTRIBUTION = GenerationConfig(
    max_new_tokens=3, num_draft_tokens=1, seed=20261, sampling=SamplingParams(temperature=1.0, top_p=0.95)
)
COOLER = 0.85  # the wrong temperature the distribution checks must tell apart from DISTRIBUTION's (their power)


class CheckFailed(AssertionError):
    """The backend disagrees with the specification; the message says where."""


@dataclass
class CheckContext:
    backend_name: str
    backend: Backend
    workspace: Workspace


@dataclass(frozen=True)
class Check:
    id: str  # "area/name[/kind]"; expected_failures.json matches these with fnmatch patterns
    description: str  # what passing asserts, one line (shown in docs/conformance.md)
    run: Callable[[CheckContext], None]
    exercises: str  # the backend component under test (portable_spec.core.backends.COMPONENTS)
    # "reference": passes by agreeing with the reference backend (meaningless on the reference itself);
    # "golden": regression snapshots that make_golden.py wrote once from the reference verifier, correct because the
    #   chi-square distribution checks pass on that verifier (so the reference column is a regression check);
    # "independent": a statistical oracle, or losslessness against the backend's own decoding
    oracle: str


# -- helpers ---------------------------------------------------------------------------------------
def _not_itself(label: str, actual, expected) -> None:
    """A comparison of an object with itself proves nothing: refuse it (a backend handing back the reference's own
    result, or a check comparing the reference with the reference)."""
    shared = actual is expected or (
        isinstance(actual, torch.Tensor)
        and isinstance(expected, torch.Tensor)
        and actual.untyped_storage().data_ptr() == expected.untyped_storage().data_ptr()
    )
    if shared:
        raise CheckFailed(
            f"{label}: compared an object with itself (the backend returned the reference's own result, "
            "or the check compared the reference with the reference): nothing was tested"
        )


def _same(label: str, actual: list, expected: list) -> None:
    _not_itself(label, actual, expected)
    if actual == expected:
        return
    if len(actual) != len(expected):
        raise CheckFailed(f"{label}: {len(actual)} requests, expected {len(expected)}")
    row = next(i for i, (a, e) in enumerate(zip(actual, expected)) if a != e)
    a, e = actual[row], expected[row]
    if not (isinstance(a, list) and isinstance(e, list)):
        raise CheckFailed(f"{label}: got {actual}, expected {expected} (first difference at request {row})")
    at = next((i for i, (x, y) in enumerate(zip(a, e)) if x != y), min(len(a), len(e)))
    raise CheckFailed(
        f"{label}: request {row} differs from token {at} on: got {a[at : at + 8]}, expected {e[at : at + 8]} "
        f"(lengths {len(a)}, {len(e)})"
    )


def _close(label: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    _not_itself(label, actual, expected)
    if tuple(actual.shape) != tuple(expected.shape):
        raise CheckFailed(f"{label}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    diff = (actual.float() - expected).abs()
    bound = TOLERANCE * (1 + expected.abs())
    if bool((diff > bound).any()):
        index = tuple(int(i) for i in torch.unravel_index((diff - bound).flatten().argmax(), diff.shape))
        raise CheckFailed(
            f"{label}: max |diff| {float(diff.max()):.3g} > {TOLERANCE:g} * (1 + |ref|), "
            f"worst at {index}: got {float(actual[index]):.6g}, expected {float(expected[index]):.6g}"
        )


def _kind_supported(ctx: CheckContext, kind: str) -> None:
    if kind not in ctx.backend.kinds_supported:
        raise CheckSkipped(f"{ctx.backend_name} supports drafter kinds {list(ctx.backend.kinds_supported)}, not {kind}")


def _sampling_label(config: GenerationConfig) -> str:
    s = config.sampling
    return f"T={s.temperature} top-k {s.top_k} top-p {s.top_p}"


def _tiny_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [
        torch.randint(0, TINY_TARGET["vocab_size"] - 1, (length,), generator=generator).tolist()
        for length in (5, 9, 3, 12)
    ]


# -- verification ----------------------------------------------------------------------------------
def _verify_golden(ctx: CheckContext, name: str) -> None:
    golden = to_tensors(load_case(GOLDEN_DIR / f"{name}.json"))
    result = ctx.backend.verify(
        golden.target_logits, golden.draft_tokens, golden.sampling, golden.noise, golden.draft_probs, golden.num_drafts
    )
    _same("accepted_len", result.accepted_len.tolist(), golden.accepted_len.tolist())
    _same("next_token", result.next_token.tolist(), golden.next_token.tolist())
    _same("output_tokens", result.output_tokens.tolist(), golden.output_tokens.tolist())


def _global_rng_states() -> list[bytes]:
    states = [
        torch.get_rng_state().numpy().tobytes(),
        repr(random.getstate()).encode(),
        np.random.get_state()[1].tobytes() + repr(np.random.get_state()[2:]).encode(),
    ]
    if torch.cuda.is_available():
        states += [state.numpy().tobytes() for state in torch.cuda.get_rng_state_all()]
    return states


def _verify_no_global_rng(ctx: CheckContext) -> None:
    golden = to_tensors(load_case(GOLDEN_DIR / "ragged_sampled_batch.json"))
    outputs = []
    with torch.random.fork_rng():
        for global_seed in (0, 1):
            torch.manual_seed(global_seed)
            random.seed(global_seed)
            np.random.seed(global_seed)
            before = _global_rng_states()
            result = ctx.backend.verify(
                golden.target_logits,
                golden.draft_tokens,
                golden.sampling,
                golden.noise,
                golden.draft_probs,
                golden.num_drafts,
            )
            if _global_rng_states() != before:
                raise CheckFailed(
                    "verify advanced a global RNG (torch, CUDA, random or numpy): take randomness only "
                    "from the VerifyNoise argument"
                )
            outputs.append(result.output_tokens.tolist())
    _same("output_tokens under global seed 1 vs 0", outputs[1], outputs[0])


def _verify_distribution(ctx: CheckContext) -> None:
    bad = [fit for fit in distribution_fits(ctx.backend.verify) if not fit.ok]
    if bad:
        raise CheckFailed("emitted tokens do not follow the target distribution p: " + "; ".join(map(str, bad)))


# -- model pieces ----------------------------------------------------------------------------------
def _target_forward(ctx: CheckContext) -> None:
    target = ctx.workspace.tiny_target()
    generator = torch.Generator().manual_seed(3)
    chain_ids = torch.randint(0, TINY_TARGET["vocab_size"], (2, 12), generator=generator)
    positions = torch.stack((torch.arange(12), torch.arange(5, 17)))
    layer_ids = list(range(TINY_TARGET["num_hidden_layers"] - 1))  # every id a drafter may use
    ref_logits, ref_features = ctx.workspace.memo(
        "reference-target-forward",
        lambda: ctx.workspace.reference.target_forward(target, chain_ids, positions, layer_ids),
    )
    logits, features = ctx.backend.target_forward(target, chain_ids, positions, layer_ids)
    _close("logits", logits, ref_logits)
    _close(f"features at layer ids {layer_ids} (output of layer i = HF hidden_states[i + 1])", features, ref_features)


def _block_logits(ctx: CheckContext, kind: str) -> None:
    _kind_supported(ctx, kind)
    target, drafter = ctx.workspace.tiny_target(), ctx.workspace.tiny_drafter(kind)
    config = read_config(drafter)
    generator = torch.Generator().manual_seed(11)
    batch, context, k = 2, 10, config.block_size
    features = torch.randn(batch, context, config.feature_size, generator=generator)
    context_positions = torch.arange(context).expand(batch, -1)
    context_valid = torch.ones(batch, context, dtype=torch.bool)
    context_valid[0, 3] = False  # a rejected slot left as a hole
    context_valid[1, 7:] = False  # a shorter request in the same batch
    block_ids = torch.randint(0, config.vocab_size, (batch, 1, k), generator=generator)
    block_positions = (torch.tensor([context, 7])[:, None] + torch.arange(k))[:, None, :]
    args = (target, drafter, features, context_positions, context_valid, block_ids, block_positions)
    expected = ctx.workspace.memo(("reference-block-logits", kind), lambda: ctx.workspace.reference.block_logits(*args))
    _close("block logits", ctx.backend.block_logits(*args), expected)


# -- end to end ------------------------------------------------------------------------------------
def _greedy_equal(ctx: CheckContext, target, drafter, prompts, config, label: str) -> None:
    key = (str(target), tuple(map(tuple, prompts)), config)
    plain = ctx.workspace.memo(
        ("plain", ctx.backend_name, *key), lambda: ctx.backend.generate(target, None, prompts, config)
    )
    if not is_reference(ctx.backend):  # the reference's own plain decoding is the specification
        reference = ctx.workspace.memo(
            ("plain", "reference", *key), lambda: ctx.workspace.reference.generate(target, None, prompts, config)
        )
        _same(f"{label}: {ctx.backend_name} non-speculative vs reference", plain, reference)
    speculative = ctx.backend.generate(target, drafter, prompts, config)
    _same(f"{label}: {ctx.backend_name} speculative vs its non-speculative", speculative, plain)


def _full_block(config: GenerationConfig, drafter) -> GenerationConfig:
    """A whole block of drafts (block_size - 1; block_size for a DSpark drafting from the anchor's slot): the round
    every backend runs (an engine's DFlash runs a K + 1 slot block, llama.cpp's DSpark from the anchor a K slot one,
    exact for a bidirectional drafter only at full length)."""
    return config.model_copy(update={"num_draft_tokens": read_config(drafter).max_draft_tokens})


def _e2e_greedy_tiny(ctx: CheckContext, kind: str) -> None:
    _kind_supported(ctx, kind)
    drafter = ctx.workspace.tiny_drafter(kind)
    _greedy_equal(
        ctx, ctx.workspace.tiny_target(), drafter, _tiny_prompts(), _full_block(TINY_GREEDY, drafter), "tiny models"
    )


def _heldout_batch(kind: str) -> tuple[Path, Path, list[list[int]]]:
    target, drafter, prompts = trained_fixture(kind)
    return target, drafter, [prompt[:length] for prompt, length in zip(prompts, HELDOUT_LENGTHS)]


def _e2e_greedy_heldout(ctx: CheckContext, kind: str) -> None:
    _kind_supported(ctx, kind)
    target, drafter, prompts = _heldout_batch(kind)
    _greedy_equal(ctx, target, drafter, prompts, _full_block(HELDOUT_GREEDY, drafter), "held-out prompts")


def _e2e_sampled_tiny(ctx: CheckContext, kind: str | None) -> None:
    if kind is not None:
        _kind_supported(ctx, kind)
    target = ctx.workspace.tiny_target()
    drafter = None if kind is None else ctx.workspace.tiny_drafter(kind)
    prompts = _tiny_prompts()

    config = TINY_SAMPLED if drafter is None else _full_block(TINY_SAMPLED, drafter)

    def sample(backend: Backend, global_seed: int) -> list[list[int]]:
        with torch.random.fork_rng(devices=[]):  # a different global RNG state must not matter
            torch.manual_seed(global_seed)
            return backend.generate(target, drafter, prompts, config)

    reference = ctx.workspace.memo(("sampled", kind), partial(sample, ctx.workspace.reference, 0))
    _same(
        f"seeded sampling (seed {TINY_SAMPLED.seed}): {ctx.backend_name} vs reference",
        sample(ctx.backend, 1234),
        reference,
    )


# -- acceptance ------------------------------------------------------------------------------------
def _reference_acceptance(ctx: CheckContext, target: Path, drafter: Path, prompts, config) -> Acceptance:
    key = ("acceptance", str(target), str(drafter), tuple(map(tuple, prompts)), config)
    return ctx.workspace.memo(key, lambda: ctx.workspace.reference.acceptance(target, drafter, prompts, config))


def _same_acceptance(label: str, actual: Acceptance, expected: Acceptance) -> None:
    """Tokens, drafting rounds and accepted drafts per position equal; per-request lengths too where both give
    them (an engine that only counts gives the counters)."""
    where = f"{label} (tau {actual.tau:.3f}, reference {expected.tau:.3f})"
    _same(f"{where}: tokens", actual.tokens, expected.tokens)
    _same(f"{where}: drafting rounds", [actual.rounds], [expected.rounds])
    _same(f"{where}: accepted drafts per position", actual.accepted_per_position, expected.accepted_per_position)
    if actual.accepted_by_request is not None and expected.accepted_by_request is not None:
        _same(f"{where}: accepted length per round", actual.accepted_by_request, expected.accepted_by_request)


def _acceptance_tiny(ctx: CheckContext, kind: str) -> None:
    _kind_supported(ctx, kind)
    target, drafter = ctx.workspace.tiny_target(), ctx.workspace.tiny_drafter(kind)
    prompts, config = _tiny_prompts(), _full_block(TINY_GREEDY, drafter)
    expected = _reference_acceptance(ctx, target, drafter, prompts, config)
    _same_acceptance("tiny models", ctx.backend.acceptance(target, drafter, prompts, config), expected)


def _acceptance_heldout(ctx: CheckContext, kind: str) -> None:
    _kind_supported(ctx, kind)
    target, drafter, prompts = _heldout_batch(kind)
    config = _full_block(HELDOUT_GREEDY, drafter)
    expected = _reference_acceptance(ctx, target, drafter, prompts, config)
    if not sum(expected.accepted_per_position):
        raise CheckFailed("the reference accepts no draft on these prompts: the comparison would prove nothing")
    _same_acceptance("held-out prompts", ctx.backend.acceptance(target, drafter, prompts, config), expected)


# -- sampled distribution --------------------------------------------------------------------------
def _samples(ctx: CheckContext, target: Path, drafter: Path | None, temperature: float, seed: int) -> list[list[int]]:
    prompt = trained_fixture("parallel")[2][0][:16]  # its next tokens are spread (the top one ~6% at T=1)
    sampling = DISTRIBUTION.sampling.model_copy(update={"temperature": temperature})
    config = DISTRIBUTION.model_copy(update={"seed": seed, "sampling": sampling})
    if drafter is not None:  # the drafts that reach the 3 tokens; a bidirectional block must run whole
        cut = read_config(drafter).block_causal
        config = config.model_copy(update={"num_draft_tokens": 2}) if cut else _full_block(config, drafter)
    key = ("samples", ctx.backend_name, str(drafter), temperature, seed)
    return ctx.workspace.memo(key, lambda: ctx.backend.generate(target, drafter, [prompt] * SAMPLES, config))


def _sampled_distribution(ctx: CheckContext, kind: str) -> None:
    """Speculative samples vs the backend's own non-speculative samples (independent seeds), at the generated
    positions a speculative round produces; and the same test must reject a wrong temperature (its power)."""
    _kind_supported(ctx, kind)
    target, drafter, _ = trained_fixture(kind)
    temperature = DISTRIBUTION.sampling.temperature
    plain = _samples(ctx, target, None, temperature, DISTRIBUTION.seed)
    cooler = _samples(ctx, target, None, COOLER, DISTRIBUTION.seed + 1)
    speculative = _samples(ctx, target, drafter, temperature, DISTRIBUTION.seed + 2)
    positions = (1, 2)  # position 0 comes from the prompt pass, before any draft
    power = [two_sample_p_value(cooler, plain, position) for position in positions]
    if min(power) >= ALPHA:
        raise CheckFailed(f"no power: T={COOLER} vs T={temperature} not told apart (p-values {power})")
    same = [two_sample_p_value(speculative, plain, position) for position in positions]
    if min(same) < ALPHA:
        raise CheckFailed(
            f"speculative tokens at positions {positions} do not follow the non-speculative distribution: "
            f"p-values {[f'{p:.2g}' for p in same]} < {ALPHA:g}"
        )


# -- upstream checkpoints --------------------------------------------------------------------------
def _upstream_import(ctx: CheckContext, layout: str) -> None:
    """The shipped parallel drafter laid out as `layout` writes it: the backend runs that directory (or, if it does
    not read the layout itself, its portable import) and must match the reference on the original drafter."""
    target, original, prompts = _heldout_batch("parallel")
    root = ctx.workspace.root

    upstream = ctx.workspace.memo(
        ("upstream", layout), lambda: write_portable_as_upstream(layout, root / f"upstream-{layout}", original, target)
    )
    drafter = upstream
    if not ctx.backend.reads_layout(layout):
        drafter = ctx.workspace.memo(
            ("imported", layout), lambda: import_drafter(upstream, target, root / f"imported-{layout}").out
        )
    config = _full_block(HELDOUT_GREEDY, original)
    expected = _reference_acceptance(ctx, target, original, prompts, config)
    _same_acceptance(f"{layout} checkpoint", ctx.backend.acceptance(target, drafter, prompts, config), expected)


# Drafters with the layer options upstream checkpoints carry: name -> (shipped fixture kind, upstream layout or None for
# a portable checkpoint, option). Sliding windows are the block size (the smallest allowed) and YaRN's original
# length is 32, so the held-out prompts (33-48 tokens) outrun both; "wider" drafters draft what the shipped ones do
# through their own embedding and head, at a width that is not the target's.
LAYER_OPTIONS = {
    "speculators_sliding": ("parallel", "speculators", "sliding"),  # speculators' trainer default: causal block
    "zlab_mixed": ("parallel", "zlab", "mixed"),  # z-lab's Qwen3.6 shape: sliding + full, causal where sliding
    "depth_causal_sliding": ("depth_causal", None, "sliding"),
    "zlab_yarn": ("parallel", "zlab", "yarn"),
    "zlab_wider": ("parallel", "zlab", "wider"),  # 320 wide on the 256-wide target: own embedding and head
    "depth_causal_wider": ("depth_causal", None, "wider"),
}
WIDER = 320
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def _option_portable(option: str, original: Path, target: Path, out: Path) -> Path:
    """The shipped drafter with a layer option: re-saved with other fields, or widened (conformance/widened.py)."""
    if option == "wider":
        return widened(original, TargetModel.load(target), out, WIDER)
    return with_attention(original, out, **_option_fields(option, read_config(original)))


def _option_fields(option: str, config) -> dict:
    if option == "yarn":
        return {"rope_scaling": YARN}
    layer_types = ["sliding_attention"] * config.num_hidden_layers
    if option == "mixed":
        layer_types[-1] = "full_attention"
    return {"layer_types": layer_types, "sliding_window": config.block_size}


def _option_drafter(ctx: CheckContext, name: str) -> tuple[Path, Path, Path, list[list[int]]]:
    """(target, the directory the backend is handed, its portable form for the reference, prompts)."""
    kind, layout, option = LAYER_OPTIONS[name]
    _kind_supported(ctx, kind)
    target, original, prompts = _heldout_batch(kind)
    root = ctx.workspace.root
    portable = ctx.workspace.memo(
        ("options", name), lambda: _option_portable(option, original, target, root / f"options-{name}")
    )
    if layout is None:
        return target, portable, portable, prompts
    upstream = ctx.workspace.memo(
        ("options-upstream", name),
        lambda: write_portable_as_upstream(layout, root / f"options-upstream-{name}", portable, target),
    )
    imported = ctx.workspace.memo(
        ("options-imported", name), lambda: import_drafter(upstream, target, root / f"options-imported-{name}").out
    )
    return target, upstream if ctx.backend.reads_layout(layout) else imported, imported, prompts


def _layer_option(ctx: CheckContext, name: str) -> None:
    """Greedy speculative == the backend's non-speculative (== the reference's); tokens, rounds and accepted drafts
    per position == the reference's on the portable form (the upstream directory imported)."""
    target, handed, portable, prompts = _option_drafter(ctx, name)
    config = _full_block(HELDOUT_GREEDY, portable)
    _greedy_equal(ctx, target, handed, prompts, config, f"{name} drafter")
    if not is_reference(ctx.backend):
        expected = _reference_acceptance(ctx, target, portable, prompts, config)
        _same_acceptance(f"{name} drafter", ctx.backend.acceptance(target, handed, prompts, config), expected)


def with_attention(source: Path, out: Path, **fields) -> Path:
    """A portable checkpoint re-saved with other layer-attention fields (layer_types, sliding_window, variant)."""
    config, weights = load_drafter_files(source)
    return save_drafter(out, DrafterConfig.model_validate({**config.model_dump(), **fields}), weights)


def _with_variant(run: Callable[[CheckContext, object], None], variant) -> Callable[[CheckContext], None]:
    """A family's check with its drafter kind (or layout) fixed: the one-argument callable a Check runs."""
    return lambda ctx: run(ctx, variant)


# -- the list --------------------------------------------------------------------------------------
def family_checks() -> list[Check]:
    """Every check family defined here, per kind or layout, in the report's order (suite.all_checks adds the
    upstream-oracle rows)."""
    checks = [
        Check(
            f"golden/{path.stem}",
            f"verify reproduces golden/{path.name} exactly: " + load_case(path).description,
            partial(_verify_golden, name=path.stem),
            "verify",
            "golden",
        )
        for path in case_paths()
    ]
    checks += [
        Check(
            "verify/no_global_rng",
            "verify leaves torch/random/numpy global RNG state untouched and its output does not depend on it",
            _verify_no_global_rng,
            "verify",
            "independent",
        ),
        Check(
            "verify/distribution",
            f"{DRAWS} keyed draws: emitted and bonus tokens follow p (chi-square p-value "
            f">= {ALPHA:g}, no p=0 token) for a dense q and one-hot drafts, T={SAMPLING.temperature}, "
            f"top-k {SAMPLING.top_k}, top-p {SAMPLING.top_p}",
            _verify_distribution,
            "verify",
            "independent",
        ),
        Check(
            "target/forward",
            "target_forward logits and features at every usable layer id match the reference "
            f"(|diff| <= {TOLERANCE:g} * (1 + |ref|)); catches a layer-id shift",
            _target_forward,
            "target_forward",
            "reference",
        ),
    ]
    # One row per family of checks, run once per drafter kind (or layout); in the report's order.
    heldout = "trained fixtures, 4 held-out prompts"
    families = [
        (
            "drafter/block_logits",
            "{} drafter block logits match the reference on a ragged batch with a masked hole",
            _block_logits,
            "block_logits",
            "reference",
        ),
        (
            "e2e/greedy_tiny",
            "tiny random models, ragged batch of 4, a whole block of "
            "drafts: greedy speculative == the backend's non-speculative == the reference's",
            _e2e_greedy_tiny,
            "generate",
            "independent",
        ),
        (
            "e2e/sampled_tiny",
            f"tiny random models, {_sampling_label(TINY_SAMPLED)}, fixed seed: tokens == the "
            "reference's, whatever the global RNG state",
            _e2e_sampled_tiny,
            "generate",
            "reference",
        ),
        (
            "acceptance/tiny",
            "tiny random models, ragged batch of 4, greedy: drafting rounds, accepted drafts per position and "
            "(where reported) each request's accepted length per round == the reference's",
            _acceptance_tiny,
            "acceptance",
            "reference",
        ),
        (
            "acceptance/heldout",
            f"{heldout}, greedy: drafting rounds, accepted drafts per position and "
            "(where reported) per-request accepted lengths == the reference's (which accepts drafts there)",
            _acceptance_heldout,
            "acceptance",
            "reference",
        ),
        (
            "distribution/sampled",
            f"{SAMPLES} samples, T={DISTRIBUTION.sampling.temperature} top-p {DISTRIBUTION.sampling.top_p}: "
            "speculative tokens follow the backend's own non-speculative distribution (chi-square two-sample, "
            f"alpha {ALPHA:g}, generated positions 1-2), and the test tells T={COOLER} apart (power)",
            _sampled_distribution,
            "generate",
            "independent",
        ),
        (
            "import",
            "the parallel fixture written in the {} layout, run as the backend loads it (natively, or "
            "imported): tokens, rounds and accepted drafts per position == the reference on the original",
            _upstream_import,
            "acceptance",
            "independent",
        ),
        (
            "e2e/greedy_heldout",
            f"{heldout}, a whole block of drafts: greedy speculative == the backend's non-speculative == the reference's",
            _e2e_greedy_heldout,
            "generate",
            "independent",
        ),
        (
            "layers",
            "drafter {} (sliding window = block size; YaRN from 32 positions: the held-out prompts outrun both; wider: "
            f"{WIDER} wide, own embedding and head, on a narrower target), "
            "as the backend loads it: greedy speculative == the backend's non-speculative == the reference's; rounds "
            "and accepted drafts per position == the reference's",
            _layer_option,
            "acceptance",
            "independent",
        ),
    ]
    variants = {"e2e/sampled_tiny": (*VARIANT_KINDS, None), "import": UPSTREAM_LAYOUTS, "layers": tuple(LAYER_OPTIONS)}
    for family, description, run, exercises, oracle in families:
        for variant in variants.get(family, VARIANT_KINDS):
            checks.append(
                Check(
                    f"{family}/{variant or 'no_drafter'}",
                    description.format(variant),
                    _with_variant(run, variant),
                    exercises,
                    oracle,
                )
            )
    return checks
