"""The ONNX backend against the torch reference: graph numerics, greedy tokens, metadata, and bad input.

Tolerance: onnxruntime vs torch block logits, float32, max abs error <= 1e-4 (measured ~5e-7).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from portable_spec.adapters.onnx import OnnxBackend, OnnxDrafterGraph, OnnxProposer  # noqa: E402
from portable_spec.adapters.onnx_export import GRAPH_FILE, META_PREFIX, export_bound_drafter, export_onnx  # noqa: E402
from portable_spec.cli import main  # noqa: E402
from portable_spec.core.backends import BACKENDS, ReferenceBackend, get_backend, inherited_components  # noqa: E402
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder  # noqa: E402
from portable_spec.core.outputs import OUTPUT_MARKER  # noqa: E402
from portable_spec.core.proposer import TorchProposer  # noqa: E402
from portable_spec.core.spec import SpecError, read_config  # noqa: E402
from portable_spec.core.target import TargetModel  # noqa: E402
from portable_spec.core.testing import save_tiny_pair, tiny_target  # noqa: E402
from portable_spec.core.variants import behaviour_of  # noqa: E402

TOLERANCE = 1e-4
BLOCK = 8  # tiny_drafter's block_size

KINDS = OnnxBackend.kinds_supported  # every kind: a sequential head's step is a graph of its own
SEQUENTIAL = [kind for kind in KINDS if behaviour_of(kind).sequential_head]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path, Path]]:
    """kind -> (target_dir, drafter_dir, graph_dir), exported once per module."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for kind in KINDS:
        target_dir, drafter_dir = save_tiny_pair(root / kind, kind)
        out[kind] = (target_dir, drafter_dir, export_onnx(drafter_dir, target_dir, root / kind / "graph"))
    torch.set_num_threads(previous)
    return out


def block_inputs(batch: int = 3, context: int = 9, width: int = BLOCK, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(batch, context, 2 * 64, generator=generator)  # 2 target layers x hidden 64
    positions = torch.arange(context).expand(batch, -1).clone()
    valid = torch.rand(batch, context, generator=generator) > 0.3
    valid[:, 0] = True
    block_ids = torch.randint(0, 255, (batch, 1, width), generator=generator)
    block_positions = (context + torch.arange(width)).expand(batch, 1, width).clone()
    return features, positions, valid, block_ids, block_positions


def assert_no_output(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "temp dir left behind"


@pytest.mark.parametrize("kind", KINDS)
def test_block_logits_match_reference(pairs, kind):
    target_dir, drafter_dir, graph_dir = pairs[kind]
    inputs = block_inputs()
    expected = ReferenceBackend().block_logits(target_dir, drafter_dir, *inputs)
    actual = OnnxBackend().block_logits(target_dir, graph_dir, *inputs)
    assert actual.shape == expected.shape == (3, 1, BLOCK, 256)
    assert (actual - expected).abs().max().item() <= TOLERANCE


class RecordingProposer:
    """Delegates to a proposer and keeps every round's drafts, so two proposers can be compared per round."""

    def __init__(self, inner) -> None:
        self.inner, self.config, self.drafts = inner, inner.config, []

    def begin(self, features, positions):
        return self.inner.begin(features, positions)

    def extend(self, state, features, positions):
        return self.inner.extend(state, features, positions)

    def crop(self, state, length):
        return self.inner.crop(state, length)

    def propose(self, state, valid, anchor_tokens, anchor_positions, num_drafts):
        drafts = self.inner.propose(state, valid, anchor_tokens, anchor_positions, num_drafts)
        self.drafts.append(drafts.clone())
        return drafts

    def passes_per_round(self, num_drafts):
        return self.inner.passes_per_round(num_drafts)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_identical(pairs, kind):
    """Every round's drafts equal the reference proposer's; emitted tokens equal autoregressive decoding."""
    target_dir, drafter_dir, graph_dir = pairs[kind]
    target = TargetModel.load(target_dir)
    onnx_proposer = RecordingProposer(OnnxProposer(OnnxDrafterGraph(graph_dir, target)))
    torch_proposer = RecordingProposer(TorchProposer(target.load_drafter(drafter_dir)))
    prompts = [[5, 17, 99, 3, 42, 7], [200, 1, 64]]
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=5)
    onnx_out = SpeculativeDecoder(target, onnx_proposer).generate(prompts, config)
    torch_out = SpeculativeDecoder(target, torch_proposer).generate(prompts, config)
    plain = SpeculativeDecoder(target).generate(prompts, config)
    assert len(onnx_proposer.drafts) == len(torch_proposer.drafts) > 0
    for ours, reference in zip(onnx_proposer.drafts, torch_proposer.drafts):
        assert torch.equal(ours, reference)
    assert onnx_out.tokens == torch_out.tokens == plain.tokens
    assert onnx_out.stats.drafter_passes == torch_out.stats.drafter_passes


def test_backend_generate_and_on_the_fly_export(pairs):
    """Given a checkpoint (not a graph), the backend exports it; generate matches the reference backend."""
    target_dir, drafter_dir, _ = pairs["depth_causal"]
    config = GenerationConfig(max_new_tokens=12, num_draft_tokens=7)
    prompts = [[9, 8, 7, 6], [1, 2]]
    assert OnnxBackend().generate(target_dir, drafter_dir, prompts, config) == ReferenceBackend().generate(
        target_dir, drafter_dir, prompts, config
    )


@pytest.mark.parametrize("kind", KINDS)
def test_short_blocks(pairs, kind):
    """Causal blocks shorter than k are exact (padding is never attended); bidirectional blocks must be k."""
    target_dir, drafter_dir, graph_dir = pairs[kind]
    inputs = block_inputs(width=5)
    backend = OnnxBackend()
    if not read_config(drafter_dir).block_causal:  # parallel, and the DFlash2 / DSpark / Domino defaults
        with pytest.raises(SpecError, match="block_size is 8"):
            backend.block_logits(target_dir, graph_dir, *inputs)
        return
    expected = ReferenceBackend().block_logits(target_dir, drafter_dir, *inputs)
    assert (backend.block_logits(target_dir, graph_dir, *inputs) - expected).abs().max().item() <= TOLERANCE


def test_metadata_and_dynamic_axes(pairs):
    target_dir, drafter_dir, graph_dir = pairs["depth_causal"]
    model = onnx.load(str(graph_dir / GRAPH_FILE))
    props = {p.key: p.value for p in model.metadata_props}
    target = TargetModel.load(target_dir)
    assert props[META_PREFIX + "variant"] == "depth_causal"
    assert props[META_PREFIX + "block_size"] == str(BLOCK)
    assert props[META_PREFIX + "target_fingerprint"] == target.fingerprint
    assert props[META_PREFIX + "target_layer_ids"] == "[0, 1]"
    assert props[META_PREFIX + "format_version"] == "1"
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert dims["features"] == ["batch", "context", 128]
    assert dims["context_valid"] == ["batch", "context"]
    assert dims["block_ids"] == ["batch", 1, BLOCK]
    onnx.checker.check_model(model)


def test_graph_bound_to_another_target_is_refused(pairs):
    _, _, graph_dir = pairs["parallel"]
    with pytest.raises(SpecError, match="target_fingerprint=.*re-export"):
        OnnxDrafterGraph(graph_dir, tiny_target(seed=1))


@pytest.mark.parametrize(
    "option, match",
    [
        (dict(opset=12), "opset=12 is not supported"),
        (dict(opset=23), "opset=23 is not supported"),
        (dict(block_size="dynamic"), "dynamic block size cannot be exported"),
        (dict(block_size=16), "block_size=16 differs from the checkpoint's block_size=8"),
    ],
)
def test_bad_export_options_leave_nothing(pairs, tmp_path, option, match):
    target_dir, drafter_dir, _ = pairs["depth_causal"]
    with pytest.raises(SpecError, match=match):
        export_onnx(drafter_dir, target_dir, tmp_path / "out", **option)
    assert_no_output(tmp_path / "out")


def test_export_for_another_target_leaves_nothing(pairs, tmp_path):
    _, drafter_dir, _ = pairs["depth_causal"]
    other = tiny_target(seed=1)
    drafter = TargetModel.load(pairs["depth_causal"][0]).load_drafter(drafter_dir)
    with pytest.raises(SpecError, match="not bound to target"):
        export_bound_drafter(other, drafter, tmp_path / "out")
    assert_no_output(tmp_path / "out")


def test_cli_export_onnx(pairs, tmp_path, capsys):
    target_dir, drafter_dir, _ = pairs["autoregressive"]
    assert (
        main(["export", "onnx", str(drafter_dir), str(tmp_path / "bad"), "--target", str(target_dir), "--opset", "9"])
        == 2
    )
    assert "opset=9" in capsys.readouterr().err
    assert_no_output(tmp_path / "bad")
    assert main(["export", "onnx", str(drafter_dir), str(tmp_path / "ok"), "--target", str(target_dir)]) == 0
    assert "max abs logits error" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "ok").iterdir()} == {
        "drafter.onnx",
        "config.json",
        "export.json",
        OUTPUT_MARKER,
    }


def test_registered_and_available():
    assert BACKENDS["onnx"] == "portable_spec.adapters.onnx:OnnxBackend"
    backend = get_backend("onnx")
    assert isinstance(backend, OnnxBackend) and backend.unavailable_reason() is None


def test_trained_fixtures_if_present(tmp_path):
    """Optional: with trained fixtures, acceptance is real (> 1 token per round) and tokens still match."""
    from portable_spec.core import fixtures

    drafter_dir = fixtures.drafter_dir("depth_causal")
    if not (fixtures.target_dir() / "config.json").exists() or not (drafter_dir / "config.json").exists():
        pytest.skip("trained fixtures not built (portable_spec/assets)")
    target = TargetModel.load(fixtures.target_dir())
    graph = OnnxDrafterGraph(export_bound_drafter(target, target.load_drafter(drafter_dir), tmp_path / "g"), target)
    prompts = [p[:48] for p in fixtures.heldout_prompts()[:2]]
    config = GenerationConfig(max_new_tokens=24, num_draft_tokens=7)
    ours = SpeculativeDecoder(target, OnnxProposer(graph)).generate(prompts, config)
    assert ours.tokens == SpeculativeDecoder(target).generate(prompts, config).tokens
    assert ours.stats.acceptance_length > 1.0


def test_onnx_decoding_is_its_own_in_the_report():
    """The ONNX backend shares the reference's target and verifier but drafts with its graph: the suite checks its
    generate and acceptance (they are not marked as inherited)."""
    assert set(inherited_components(OnnxBackend())) == {"verify", "target_forward"}


@pytest.mark.parametrize("kind", SEQUENTIAL)
def test_a_sequential_heads_step_graph_matches_the_reference_step(pairs, kind):
    """head_step.onnx against the drafter's own step (core/head_step.py) on inputs other than the trace's: scores
    (-inf at the same places), the next state, and a dspark's predicted acceptance."""
    from portable_spec.adapters.onnx_export import STEP_FILE, BoundDrafter, BoundHeadStep

    target_dir, drafter_dir, graph_dir = pairs[kind]
    target = TargetModel.load(target_dir)
    graph = OnnxDrafterGraph(graph_dir, target)
    step = BoundHeadStep(BoundDrafter(target.load_drafter(drafter_dir))).eval()
    inputs = step.example_inputs(batch=4, seed=7)
    with torch.no_grad():
        expected = step.step(*inputs)
    actual = graph.step(*inputs)
    assert (graph_dir / STEP_FILE).exists() and len(actual) == len(expected) == 3
    for ours, reference in zip(actual, expected):
        if reference is None:
            assert ours is None
            continue
        finite = torch.isfinite(reference)
        assert torch.equal(torch.isfinite(ours), finite)
        scale = max(1.0, reference[finite].abs().max().item())
        assert (ours - reference)[finite].abs().max().item() <= TOLERANCE * scale
    assert (expected[2] is not None) == (kind == "dspark")


@pytest.mark.parametrize("kind", SEQUENTIAL)
def test_sampled_drafts_are_the_references_draw_for_draw(pairs, kind):
    """At T > 0 a sequential head draws its drafts from its own q with portable-spec's seeded sampler: the ONNX
    proposer's drafts, q and emitted tokens equal the reference proposer's, round by round."""
    target_dir, drafter_dir, graph_dir = pairs[kind]
    target = TargetModel.load(target_dir)
    proposers = [OnnxProposer(OnnxDrafterGraph(graph_dir, target)), TorchProposer(target.load_drafter(drafter_dir))]
    rounds = [[], []]
    for proposer, seen in zip(proposers, rounds):
        original = proposer.propose_sampled

        def recording(*args, original=original, seen=seen):
            out = original(*args)
            seen.append(out)
            return out

        proposer.propose_sampled = recording
    config = GenerationConfig(max_new_tokens=16, num_draft_tokens=5, seed=11, sampling={"temperature": 1.0})
    prompts = [[5, 17, 99, 3, 42, 7], [200, 1, 64]]
    onnx_out, torch_out = (SpeculativeDecoder(target, p).generate(prompts, config) for p in proposers)
    assert onnx_out.tokens == torch_out.tokens and len(rounds[0]) == len(rounds[1]) > 1
    for (drafts, probability, q), (ref_drafts, ref_probability, ref_q) in zip(*rounds):
        assert torch.equal(drafts, ref_drafts)
        torch.testing.assert_close(q, ref_q, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(probability, ref_probability, rtol=1e-4, atol=1e-5)


def test_a_sequential_export_needs_both_graphs_from_one_export(pairs, tmp_path):
    """The step graph missing, or taken from another export, is refused by name on load."""
    import shutil

    from portable_spec.adapters.onnx_export import STEP_FILE

    target = TargetModel.load(pairs["dspark"][0])
    alone = tmp_path / "alone"
    shutil.copytree(pairs["dspark"][2], alone)
    (alone / STEP_FILE).unlink()
    with pytest.raises(SpecError, match="head_step.onnx: not found; a dspark export holds the head's step graph"):
        OnnxDrafterGraph(alone, target)
    mixed = tmp_path / "mixed"
    shutil.copytree(pairs["dspark"][2], mixed)
    shutil.copy(pairs["domino"][2] / STEP_FILE, mixed / STEP_FILE)
    with pytest.raises(SpecError, match="the two graphs come from two exports"):
        OnnxDrafterGraph(mixed, target)
