"""The suite catches what it exists to catch: deliberately broken toy backends fail the checks aimed at them."""

from __future__ import annotations

import pytest

from portable_spec import cli
from portable_spec.conformance.runner import (
    FAIL,
    INHERITS,
    PASS,
    SKIP,
    SPEC,
    XFAIL,
    XPASS,
    ExpectedFailures,
    format_report,
    resolve_backend,
    run_check,
)
from portable_spec.conformance.suite import all_checks
from portable_spec.core.backends import BACKENDS, ReferenceBackend, inherited_components
from tests.conformance.toy_backends import (
    DecodeLayerShiftBackend,
    EchoReferenceBackend,
    GlobalRngBackend,
    LayerShiftBackend,
    OffByOneBackend,
    ToyVerifierBackend,
    UnavailableBackend,
    ZeroQBackend,
)

CHECKS = {check.id: check for check in all_checks()}
NONE_EXPECTED = ExpectedFailures(format_version=1, entries=[])
VERIFY_CHECKS = [cid for cid in CHECKS if cid.startswith(("golden/", "verify/"))]


def outcomes(backend, check_ids, workspace, expected=NONE_EXPECTED):
    resolved = resolve_backend(backend.name, backend)
    return {cid: run_check(resolved, CHECKS[cid], workspace, expected) for cid in check_ids}


def test_toy_verifier_without_bug_conforms(workspace) -> None:
    results = outcomes(ToyVerifierBackend(), VERIFY_CHECKS, workspace)
    assert {cid: o.detail for cid, o in results.items() if o.status != PASS} == {}


def test_off_by_one_acceptance_is_caught(workspace) -> None:
    results = outcomes(OffByOneBackend(), VERIFY_CHECKS, workspace)
    for cid in (
        "golden/greedy_first_reject",
        "golden/temperature_first_reject",
        "golden/greedy_ties",
        "verify/distribution",
    ):
        assert results[cid].status == FAIL, cid
    assert "accepted_len" in results["golden/greedy_first_reject"].detail
    assert results["golden/greedy_all_accept"].status == PASS  # nothing to reject: the bug is invisible there


def test_accepting_a_draft_with_zero_draft_probability_is_caught(workspace) -> None:
    """The hole found by hand (top-k 2, q(draft) = 0, p(draft) = 0: u * q <= p held) fails the golden file."""
    results = outcomes(ZeroQBackend(), VERIFY_CHECKS, workspace)
    assert results["golden/draft_prob_zero"].status == FAIL
    assert "accepted_len" in results["golden/draft_prob_zero"].detail


def test_verifier_using_global_rng_is_caught(workspace) -> None:
    results = outcomes(GlobalRngBackend(), VERIFY_CHECKS, workspace)
    assert results["verify/no_global_rng"].status == FAIL
    assert "global RNG" in results["verify/no_global_rng"].detail
    sampled = [
        cid
        for cid in (
            "golden/temperature",
            "golden/top_k",
            "golden/top_p",
            "golden/ragged_sampled_batch",
            "golden/draft_probs_ragged",
        )
        if results[cid].status == FAIL
    ]
    assert len(sampled) >= 3, {cid: o.status for cid, o in results.items()}
    assert results["golden/greedy_ties"].status == PASS  # greedy consumes no noise


def test_wrong_layer_id_shift_is_caught(workspace) -> None:
    results = outcomes(LayerShiftBackend(), ["target/forward", "golden/top_k"], workspace)
    assert results["target/forward"].status == FAIL
    assert "features" in results["target/forward"].detail
    assert results["golden/top_k"].status == INHERITS  # its verify is the reference's: not a pass


def test_a_backend_returning_the_references_own_objects_is_caught(workspace) -> None:
    """Comparing an object with itself can never pass: the echo backend fails every check it takes part in."""
    EchoReferenceBackend.workspace = workspace
    ids = ["target/forward", "drafter/block_logits/depth_causal", "e2e/greedy_tiny/parallel"]
    results = outcomes(EchoReferenceBackend(), ids, workspace)
    for cid in ids:
        assert results[cid].status == FAIL and "compared an object with itself" in results[cid].detail, cid
    assert outcomes(EchoReferenceBackend(), ["golden/top_k"], workspace)["golden/top_k"].status == INHERITS


def test_the_reference_is_never_compared_with_itself(workspace) -> None:
    """Reference column: checks whose only oracle is the reference are `spec`; the rest (golden files, statistics,
    losslessness against its own plain decoding) really run and pass."""
    ids = [
        "golden/top_k",
        "verify/distribution",
        "target/forward",
        "drafter/block_logits/parallel",
        "e2e/greedy_tiny/depth_causal",
        "e2e/sampled_tiny/parallel",
    ]
    results = outcomes(ReferenceBackend(), ids, workspace)
    assert {cid: o.status for cid, o in results.items()} == {
        "golden/top_k": PASS,
        "verify/distribution": PASS,
        "target/forward": SPEC,
        "drafter/block_logits/parallel": SPEC,
        "e2e/greedy_tiny/depth_causal": PASS,
        "e2e/sampled_tiny/parallel": SPEC,
    }


def test_unavailable_backend_is_skipped_with_its_reason_never_passed(workspace) -> None:
    results = outcomes(UnavailableBackend(), list(CHECKS), workspace)
    assert {o.status for o in results.values()} == {SKIP}
    assert all("needs a CUDA device" in o.detail for o in results.values())
    report = format_report(list(results.values()), list(CHECKS.values()))
    assert "| pass |" not in report and f"- unavailable: {len(CHECKS)} skip\n" in report


def test_backend_that_cannot_be_constructed_fails_every_check(workspace) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(BACKENDS, "ghost", "conformance.toy_backends:NoSuchBackend")
        resolved = resolve_backend("ghost")
    assert resolved.error is not None
    assert run_check(resolved, CHECKS["golden/top_k"], workspace, NONE_EXPECTED).status == FAIL


def test_expected_failures_turn_fail_into_xfail_and_pass_into_xpass(workspace) -> None:
    expected = ExpectedFailures.model_validate(
        {
            "format_version": 1,
            "entries": [
                {
                    "backend": "broken_off_by_one",
                    "check": "golden/*first_reject",
                    "reason": "toy: counts the rejected draft",
                },
                {
                    "backend": "broken_off_by_one",
                    "check": "golden/greedy_all_accept",
                    "reason": "toy: listed but passes",
                },
            ],
        }
    )
    results = outcomes(
        OffByOneBackend(), ["golden/greedy_first_reject", "golden/greedy_all_accept"], workspace, expected
    )
    assert results["golden/greedy_first_reject"].status == XFAIL
    assert results["golden/greedy_all_accept"].status == XPASS


def test_registered_broken_backend_fails_the_cli(tmp_path, monkeypatch) -> None:
    """Registration is one registry line; the command then reports the failure and exits 1."""
    monkeypatch.setitem(BACKENDS, "broken_off_by_one", "conformance.toy_backends:OffByOneBackend")
    report = tmp_path / "conformance.md"
    code = cli.main(
        [
            "conformance",
            "--backends",
            "reference",
            "broken_off_by_one",
            "--checks",
            "golden/greedy_*",
            "--output",
            str(report),
        ]
    )
    text = report.read_text()
    assert code == 1
    assert "| golden/greedy_first_reject | pass | FAIL [1] |" in text
    assert "FAIL (broken_off_by_one): accepted_len" in text


def test_a_layer_shift_in_decoding_is_caught_by_acceptance_not_by_greedy_equality(workspace) -> None:
    """The issue the acceptance checks exist for: one drafter, another acceptance in another backend. The shifted
    backend's output stays lossless (greedy equality passes) but its drafts fare differently."""
    kinds = ("parallel", "depth_causal")
    results = outcomes(
        DecodeLayerShiftBackend(),
        [f"{area}/{kind}" for kind in kinds for area in ("e2e/greedy_heldout", "acceptance/heldout")],
        workspace,
    )
    for kind in kinds:
        assert results[f"e2e/greedy_heldout/{kind}"].status == PASS, results[f"e2e/greedy_heldout/{kind}"].detail
        failed = results[f"acceptance/heldout/{kind}"]
        assert failed.status == FAIL, kind
        assert "accepted drafts per position" in failed.detail or "drafting rounds" in failed.detail, failed.detail


def test_inherited_components_follow_the_decoder() -> None:
    """A backend that drafts in the reference loop with its own decoder (ONNX, a broken one) decodes independently
    of the reference; one that keeps the reference's decoder (a verify-only change) runs the reference's decoding."""
    assert set(inherited_components(LayerShiftBackend())) == {"verify", "block_logits", "generate", "acceptance"}
    assert set(inherited_components(DecodeLayerShiftBackend())) == {"verify", "target_forward", "block_logits"}
    assert set(inherited_components(OffByOneBackend())) == {"target_forward", "block_logits", "generate", "acceptance"}
    assert set(inherited_components(EchoReferenceBackend())) == {"verify"}
