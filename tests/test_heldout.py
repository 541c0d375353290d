"""Held-out acceptance while training: the rounds simulated over teacher-forced drafts are the decode loop's rounds,
request by request; the tracker keeps the best drafter and stops on a plateau; a warm start resumes from a drafter."""

import json

import pytest
import torch
from fixture_training import train_drafter

from portable_spec.core import fixtures
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import VARIANT_KINDS, SpecError
from portable_spec.core.target import TargetModel, drafter_config_for
from portable_spec.core.testing import tiny_target
from portable_spec.training.config import EvalConfig, TrainConfig
from portable_spec.training.features import FeatureDataset
from portable_spec.training.heldout import HeldoutAcceptance, HeldoutTracker, simulate_rounds
from portable_spec.training.replies import Sequences
from portable_spec.training.state import warm_start

pytestmark = pytest.mark.usefixtures("one_thread")
MAX_NEW = 24


@pytest.fixture(scope="module")
def fixture_target():
    return TargetModel.load(fixtures.target_dir())


def _greedy_dataset(target: TargetModel, prompts: list[list[int]], reply_len: int, layer_ids) -> FeatureDataset:
    """Prompt + greedy reply sequences with fp32 target features (what the cache holds, before its bf16 rounding)."""
    replies = SpeculativeDecoder(target).generate(prompts, GenerationConfig(max_new_tokens=reply_len)).tokens
    sequences = Sequences.from_lists(prompts, replies)
    features = []
    for index in range(len(sequences)):
        tokens = sequences.sequence(index)[None]
        positions = torch.arange(tokens.shape[1])[None]
        with torch.no_grad():
            _, feats = target.forward(
                tokens, positions, torch.ones_like(tokens, dtype=torch.bool), target.new_cache(), layer_ids
            )
        features.append(feats[0])
    return FeatureDataset(sequences, torch.cat(features))


@pytest.mark.parametrize("kind", VARIANT_KINDS)
@pytest.mark.parametrize("num_drafts", [3, 7])
def test_simulated_rounds_are_the_decode_loops_rounds(fixture_target, kind, num_drafts):
    """Same prompts, same drafter: the accepted drafts of every round equal SpeculativeDecoder's, request by request.
    The reply runs num_drafts past max_new_tokens so the last round's drafts can be checked, as decoding checks them."""
    target, prompts = fixture_target, fixtures.heldout_prompts()[:3]
    drafter = target.load_drafter(fixtures.drafter_dir(kind))
    stats = (
        SpeculativeDecoder(target, drafter)
        .generate(prompts, GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=num_drafts))
        .stats
    )
    dataset = _greedy_dataset(target, prompts, MAX_NEW + num_drafts, drafter.config.target_layer_ids)
    from portable_spec.training.heldout import greedy_drafts_at

    for index, decoded in enumerate(stats.accepted_by_request):
        tokens = dataset.sequences.sequence(index)
        prompt_len = len(prompts[index])
        start = int(dataset.sequences.offsets[index])
        drafts = greedy_drafts_at(drafter, dataset.features[start : start + len(tokens)], tokens, prompt_len)
        simulated = simulate_rounds(tokens[prompt_len:].tolist(), drafts, num_drafts, max_new_tokens=MAX_NEW)
        assert simulated == decoded
    assert sum(map(sum, stats.accepted_by_request)) > 0  # the check saw accepted drafts, not only rejections


def test_simulate_rounds_counts_the_unknown_tail_as_rejected():
    reply = [5, 6, 7, 8, 9]
    drafts = torch.tensor([[6, 7], [7, 8], [8, 9], [9, 10], [10, 11]])  # every draft is the reply's next token
    assert simulate_rounds(reply, drafts, 2) == [2, 1]  # the second round's second draft is past the reply
    assert simulate_rounds(reply, drafts, 2, max_new_tokens=3) == [2]
    wrong = torch.zeros(5, 2, dtype=torch.int64)
    assert simulate_rounds(reply, wrong, 2) == [0, 0, 0, 0]


def test_heldout_acceptance_reports_tau_per_block(fixture_target):
    target = fixture_target
    drafter = target.load_drafter(fixtures.drafter_dir("depth_causal"))
    dataset = _greedy_dataset(target, fixtures.heldout_prompts()[:2], MAX_NEW, drafter.config.target_layer_ids)
    report = HeldoutAcceptance(dataset, blocks=(4, 16))(drafter)
    stats = (
        SpeculativeDecoder(target, drafter)
        .generate(fixtures.heldout_prompts()[:2], GenerationConfig(max_new_tokens=MAX_NEW, num_draft_tokens=3))
        .stats
    )
    emitted = [a + 1 for request in stats.accepted_by_request for a in request]
    # the reply ends at MAX_NEW here, so a last round may be cut short; tau can only be lower, and rarely is
    assert report["tau"][4] <= sum(emitted) / len(emitted) + 1e-9
    assert report["tau"][4] > 1.2 and report["tau"][16] >= report["tau"][4] - 0.5
    assert len(report["acceptance_by_position"][16]) == 15 and not drafter.training
    with pytest.raises(SpecError, match="--eval-blocks 32"):
        EvalConfig(eval_blocks=(32,)).check_blocks(drafter.config.block_size)


def _strict(text: str):
    """json.loads as RFC 8259 has it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a result file"))


def test_the_log_is_standard_json_with_null_for_slots_no_round_reached(fixture_target, tmp_path):
    target = fixture_target
    drafter = target.load_drafter(fixtures.drafter_dir("depth_causal"))
    dataset = _greedy_dataset(target, fixtures.heldout_prompts()[:2], MAX_NEW, drafter.config.target_layer_ids)
    evaluate = HeldoutAcceptance(dataset, blocks=(16,))
    deep = evaluate(drafter)["acceptance_by_position"][16]
    assert any(p != p for p in deep)  # NaN: some slot no round reached, what the log must write as null
    HeldoutTracker(evaluate, 0.0, tmp_path / "heldout.jsonl", tmp_path / "best").record(drafter, 0, 0.0)
    [entry] = [_strict(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert entry["acceptance_by_position"]["16"] == [None if p != p else p for p in deep]


def _tiny_setup():
    target = tiny_target()
    config = drafter_config_for(
        target, kind="depth_causal", block_size=4, num_hidden_layers=1, target_layer_ids=[0, 1], mask_token_id=255
    )
    stream = torch.arange(4000) % 37
    prompts = [[int(t) for t in stream[i : i + 5]] for i in (0, 7, 19)]
    return target, config, stream, prompts


def test_tracker_writes_the_best_drafter_and_logs_every_evaluation(tmp_path):
    target, config, stream, prompts = _tiny_setup()
    dataset = _greedy_dataset(target, prompts, 30, config.target_layer_ids)
    tracker = HeldoutTracker(
        HeldoutAcceptance(dataset, blocks=(4,)), 0.0, tmp_path / "heldout.jsonl", tmp_path / "best"
    )
    train = TrainConfig(steps=30, batch_size=4, seq_len=32, anchors_per_seq=4, lr=1e-2, warmup_steps=2)
    drafter = train_drafter(target, config, stream, train, tmp_path / "out", progress=False, heldout=tracker)
    log = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == list(range(31))  # at the start, after every step (every=0), none twice
    best = max(log, key=lambda e: e["tau"]["4"])
    assert json.loads((tmp_path / "best" / "heldout.json").read_text()) == {
        "step": best["step"],
        "tau": best["tau"]["4"],
    }
    assert HeldoutAcceptance(dataset, blocks=(4,))(drafter)["tau"][4] == best["tau"]["4"]  # the checkpoint is the best


def test_tracker_stops_on_a_plateau(tmp_path):
    target, config, stream, prompts = _tiny_setup()
    dataset = _greedy_dataset(target, prompts, 30, config.target_layer_ids)
    tracker = HeldoutTracker(
        HeldoutAcceptance(dataset, blocks=(4,)), 0.0, tmp_path / "h.jsonl", tmp_path / "best", plateau=2
    )
    train = TrainConfig(steps=200, batch_size=2, seq_len=32, anchors_per_seq=2, lr=1e-9, warmup_steps=0)
    train_drafter(target, config, stream, train, tmp_path / "out", progress=False, heldout=tracker)
    log = (tmp_path / "h.jsonl").read_text().splitlines()
    assert len(log) == 3  # start, then two evaluations without a gain (lr 1e-9 learns nothing)


def test_warm_start_continues_from_the_drafter_and_refuses_another_shape(tmp_path):
    target, config, stream, _ = _tiny_setup()
    first = train_drafter(
        target,
        config,
        stream,
        TrainConfig(steps=20, batch_size=2, seq_len=32, anchors_per_seq=3, lr=1e-2),
        tmp_path / "first",
        progress=False,
    )
    tiny = TrainConfig(steps=1, batch_size=2, seq_len=32, anchors_per_seq=3, lr=1e-12, warmup_steps=0)
    warm = train_drafter(
        target,
        config,
        stream,
        tiny.model_copy(update={"init_from": str(tmp_path / "first")}),
        tmp_path / "warm",
        progress=False,
    )
    cold = train_drafter(target, config, stream, tiny, tmp_path / "cold", progress=False)
    for name, tensor in first.state_dict().items():  # lr 1e-12 moves nothing: warm is the first drafter
        assert torch.allclose(warm.state_dict()[name], tensor, atol=1e-6), name
    assert not torch.allclose(cold.fc.weight, first.fc.weight)
    other = config.model_copy(update={"intermediate_size": config.intermediate_size * 2})
    with pytest.raises(SpecError, match="--init-from .*intermediate_size"):
        warm_start(target, other, tmp_path / "first")


def _log(path, *entries):
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def test_resume_with_other_eval_settings_is_refused_before_loading(tmp_path):
    """Issue 47 item 6: resumed with other --eval-blocks or --heldout-eval-prompts, the run compared tau at
    another block (or on other prompts) with the saved best drafter's, and the summary then raised KeyError."""
    from portable_spec.training.heldout import check_resumed_evaluation

    state = tmp_path / "state-dc"
    state.mkdir()
    log = _log(tmp_path / "dc-heldout.jsonl", {"step": 0, "tau": {"4": 1.2, "16": 1.3}, "eval_prompts": 8})
    check_resumed_evaluation(log, state, (4, 16), 8)  # the same settings resume
    with pytest.raises(SpecError, match=r"--eval-blocks 4 16 \(asked 8\)"):
        check_resumed_evaluation(log, state, (8,), 8)
    with pytest.raises(SpecError, match=r"--heldout-eval-prompts 8 \(asked 16\)"):
        check_resumed_evaluation(log, state, (4, 16), 16)
    check_resumed_evaluation(log, tmp_path / "state-fresh", (8,), 16)  # a fresh run: nothing to be held to
    (tmp_path / "bad.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(SpecError, match="not a held-out log"):
        check_resumed_evaluation(tmp_path / "bad.jsonl", state, (4,), 8)


def test_summary_reads_the_last_run_of_a_reused_work_dir(tmp_path):
    from portable_spec.training.heldout import summarize_heldout_log

    log = _log(
        tmp_path / "dc-heldout.jsonl",
        {"step": 0, "tau": {"4": 1.1}, "sequences": 4},
        {"step": 50, "tau": {"4": 1.5}, "sequences": 4},
        {"step": 0, "tau": {"8": 1.2}, "sequences": 4},  # a fresh run with other blocks, same work dir
        {"step": 40, "tau": {"8": 1.3}, "sequences": 4},
    )
    summary = summarize_heldout_log(log)
    assert summary["heldout_block"] == 8 and summary["heldout_tau"] == 1.3 and summary["heldout_tau_at_start"] == 1.2
