"""The upstream oracle itself: its rows pass on the reference, and they catch the misreadings they exist for.

The `upstream`-marked tests run the upstream packages' own code, in the venvs `.ci/upstream_oracle_tests.sh` builds
(or those named by PORTABLE_SPEC_UPSTREAM_VENVS), in that CI stage; the default suite deselects them. The comparison helper's
own failure modes are tested without any venv.
"""

from __future__ import annotations

import pytest
import torch

from portable_spec.conformance.checks import CheckContext, CheckFailed
from portable_spec.conformance.upstream_oracle.cases import CASES, UpstreamCase
from portable_spec.conformance.upstream_oracle.checks import _block_check, compare_slots, upstream_checks
from portable_spec.conformance.upstream_oracle.oracle import venv_python
from portable_spec.conformance.workspace import CheckSkipped, Workspace
from portable_spec.core.backends import ReferenceBackend


def _needs(package: str) -> None:
    try:
        venv_python(package)
    except CheckSkipped as skip:
        pytest.skip(str(skip))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("oracle"))


def _context(workspace) -> CheckContext:
    return CheckContext("reference", ReferenceBackend(), workspace)


def test_every_case_is_a_row_with_the_upstream_as_oracle():
    rows = upstream_checks()
    assert [row.id for row in rows] == [case.id for case in CASES]
    assert {row.oracle for row in rows} == {"upstream"}
    packages = {case.package for case in CASES}
    assert packages == {"dflash", "speculators", "specforge"}
    for package in packages:  # the cases the issue names, per package that reads them
        names = {case.name for case in CASES if case.package == package}
        assert any("sliding" in name for name in names) and any("yarn" in name for name in names)


def test_compare_slots_fails_on_a_changed_slot_a_changed_argmax_and_a_changed_vocabulary():
    expected = torch.randn(3, 50)
    compare_slots("same", expected.clone(), expected)
    shifted = expected.clone()
    shifted[1] += 0.01 * torch.arange(50)
    with pytest.raises(CheckFailed, match=r"draft slots \[2\]"):
        compare_slots("shifted", shifted, expected)
    masked = expected.clone()
    masked[:, 7] = float("-inf")
    with pytest.raises(CheckFailed, match="different set of tokens"):
        compare_slots("vocab", masked, expected)


@pytest.mark.upstream
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rows_pass_on_the_reference(workspace, case):
    _needs(case.package)
    _block_check(_context(workspace), case)


@pytest.mark.upstream
@pytest.mark.parametrize(
    "package,name,wrong",
    [
        ("speculators", "sliding_b8", {"window_rule": "per_slot"}),  # what portable-spec read before: issue 42
        ("speculators", "mixed", {"window_rule": "per_slot"}),
        ("dflash", "sliding", {"window_rule": "per_anchor"}),
        ("dflash", "mixed", {"block_attention": "bidirectional"}),  # SpecForge's spec_generate reading
        ("speculators", "sliding_b8", {"block_attention": "bidirectional"}),
    ],
)
def test_a_misread_window_or_block_attention_fails_its_row(workspace, package, name, wrong):
    """Imported with another rule than the trainer's, the drafter computes another function and the row says so:
    the oracle can tell the rules apart (the upstream, not a hand-written mask, is what differs)."""
    _needs(package)
    case = next(c for c in CASES if c.package == package and c.name == name)
    misread = UpstreamCase(**{**case.__dict__, "import_options": wrong})
    with pytest.raises(CheckFailed, match="differ from the upstream's own forward"):
        _block_check(_context(workspace), misread)


@pytest.mark.upstream
@pytest.mark.parametrize(
    "broken,match",
    [
        ("conv", "differ from the upstream's own forward"),  # the convolutions' taps along the block
        ("selector", r"drafts \[\[.*dflash's own"),  # the bigram scores of the candidate selector
    ],
)
def test_a_dflash2_port_that_drops_a_piece_fails_its_row(workspace, monkeypatch, broken, match):
    """The DFlash2 rows tell the pieces apart: without the convolution's second tap the logits differ from z-lab's;
    without the selector's bigram term (plain top-1 drafts) the drafts do."""
    _needs("dflash")
    from portable_spec.core import drafter_layers, selector

    case = next(c for c in CASES if c.name == "dflash2_b8")
    if broken == "conv":
        original = drafter_layers.grouped_causal_convolve
        monkeypatch.setattr(
            drafter_layers,
            "grouped_causal_convolve",
            lambda h, dynamic, base, group_size: original(h, dynamic[..., :1, :], base[:1], group_size),
        )
    else:
        monkeypatch.setattr(
            selector.CandidateSelector, "transition_scores", lambda self, projected, prev, cands: cands * 0.0
        )
    with pytest.raises(CheckFailed, match=match):
        _block_check(_context(Workspace(workspace.root / f"broken-{broken}")), case)


@pytest.mark.upstream
@pytest.mark.parametrize(
    "broken,name",
    [
        ("no_bias", "dspark_b8"),  # the Markov bias left out: DFlash's logits
        ("previous", "dspark_gated"),  # sample_from_anchor's previous-token rule where it is false
        ("previous", "dspark_rnn_dflash"),
    ],
)
def test_a_dspark_port_that_misreads_a_piece_fails_its_row(workspace, monkeypatch, broken, name):
    """The DSpark rows tell the pieces apart: speculators' own heads, teacher-forced and chained, disagree with a
    port that drops the bias or takes the from-anchor previous tokens where sample_from_anchor is false. (That the
    chain is the teacher-forced function on its own drafts, the recurrence from slot 0 included, is
    tests/test_dspark.py's.)"""
    _needs("speculators")
    from portable_spec.core import drafter, markov

    if broken == "no_bias":
        step = markov.MarkovHead.step
        monkeypatch.setattr(markov.MarkovHead, "step", lambda self, *a: (step(self, *a)[0], step(self, *a)[1] * 0))
    else:
        monkeypatch.setattr(drafter, "previous_tokens", lambda block_tokens, from_anchor: block_tokens)
    case = next(c for c in CASES if c.package == "speculators" and c.name == name)
    with pytest.raises(CheckFailed, match="differ from the upstream's own forward|speculators's own"):
        _block_check(_context(Workspace(workspace.root / f"broken-{broken}-{name}")), case)


@pytest.mark.upstream
@pytest.mark.parametrize("broken,name", [("no_correction", "domino_b8"), ("no_prefix", "domino_prefix")])
def test_a_domino_port_that_misreads_a_piece_fails_its_row(workspace, monkeypatch, broken, name):
    """The Domino rows tell the pieces apart: SpecForge's own head disagrees with a port that drops the GRU correction
    or corrects the slots pure_draft_prefix_len leaves alone."""
    _needs("specforge")
    from portable_spec.core import domino, drafter, head_step

    if broken == "no_correction":  # teacher-forced (the logits rows) and in the decoding chain (the drafts)
        monkeypatch.setattr(drafter, "block_corrections", lambda *a: domino.block_corrections(*a) * 0)
        step = domino.step_correction
        monkeypatch.setattr(head_step, "step_correction", lambda *a: (step(*a)[0], step(*a)[1] * 0))
    else:
        monkeypatch.setattr(
            drafter,
            "block_corrections",
            lambda gru, proj, prev, hidden, prefix: domino.block_corrections(gru, proj, prev, hidden, 0),
        )
    case = next(c for c in CASES if c.package == "specforge" and c.name == name)
    with pytest.raises(CheckFailed, match="differ from the upstream's own forward"):
        _block_check(_context(Workspace(workspace.root / f"broken-{broken}-{name}")), case)


@pytest.mark.upstream
def test_the_sequential_rows_chains_change_picks(workspace):
    """Each DSpark and Domino row's upstream drafts differ from the plain argmax of the same block's uncorrected
    logits in some slot, so the chained-drafts compare tests the chain, not DFlash's argmax."""
    from portable_spec.conformance.upstream_oracle.checks import _answer, _block_logits, _imported, _inputs

    ctx = _context(workspace)
    for case in (c for c in CASES if c.dspark or c.domino):
        _needs(case.package)
        dspark = case.dspark or {}
        answer = _answer(ctx, case)
        logits = _block_logits(ctx.backend, case, _imported(ctx, case, answer), _inputs(ctx))  # slots 1..k-1
        plain = logits.argmax(-1).tolist()
        drafts = answer.drafts[0].tolist()
        offset = 1 if case.dspark and dspark.get("sample_from_anchor", True) else 0  # drafts[i]: slot i (+1 if not)
        assert drafts[offset:] != plain[: len(drafts) - offset], case.id


@pytest.mark.upstream
@pytest.mark.parametrize("kind", ["parallel", "dflash2", "dspark"])
def test_export_speculators_is_read_by_speculators_own_classes(tmp_path, kind):
    """`portable-spec export speculators` of a trained fixture drafter, read by speculators 0.9.0's own config and
    model classes (`SpeculatorModelConfig.from_pretrained`, its DFlash / DFlash2 model, every weight loaded
    strictly): its forward drafts what the portable drafter drafts, slot by slot, and a dflash2's selector picks the
    same drafts."""
    _needs("speculators")
    from portable_spec.adapters.upstream.speculators import export_speculators
    from portable_spec.conformance.upstream_oracle.cases import CONTEXT
    from portable_spec.conformance.upstream_oracle.oracle import oracle_inputs, run_loaded
    from portable_spec.core import fixtures
    from portable_spec.core.target import TargetModel

    inputs = oracle_inputs()
    exported = export_speculators(fixtures.drafter_dir(kind), tmp_path / "spec", fixtures.target_dir())
    target = TargetModel.load(fixtures.target_dir())
    drafter = target.load_drafter(fixtures.drafter_dir(kind))
    k = drafter.config.block_size
    own = {kind: True} if kind != "parallel" else {}  # the worker's builder; the switches come from config.json
    answer = run_loaded("speculators", exported, k, own, inputs, tmp_path / "oracle")
    positions = torch.arange(CONTEXT)[None]
    context = drafter.context_kv(inputs.features, positions)
    valid = torch.ones(1, CONTEXT, dtype=torch.bool)
    block = torch.tensor([[[inputs.anchor] + [drafter.config.mask_token_id] * (k - 1)]])
    slots = drafter.draft_slots(drafter.config.max_draft_tokens)
    with torch.no_grad():
        hidden = drafter.block_hidden(block, (CONTEXT + torch.arange(k))[None, None], context, valid, positions)
        logits = drafter.teacher_forced_logits(hidden, inputs.true_tokens(k)[None])[0, 0]
    compare_slots(f"export speculators ({kind})", logits.float(), answer.logits[0, slots].float())
    if kind != "parallel":
        drafts = drafter.propose(
            context, valid, torch.tensor([inputs.anchor]), torch.tensor([CONTEXT]), slots.stop - slots.start, positions
        )
        assert drafts.tolist() == answer.drafts.tolist()
