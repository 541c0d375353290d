"""The real-target training recipe, on data small enough for the default suite: ShareGPT parsing (truncated file),
deterministic split, reply shards (resumable), cached features, draft vocabulary, DFlash layer choice, training."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from portable_spec.core.spec import SpecError
from portable_spec.core.target import TargetModel
from portable_spec.core.testing import save_tiny_pair
from portable_spec.training.config import ReplyConfig
from portable_spec.training.draft_vocab import frequent_tokens
from portable_spec.training.drafter_shape import dflash_target_layer_ids
from portable_spec.training.features import FeatureDataset, cache_features
from portable_spec.training.replies import generate_replies, load_sequences
from portable_spec.training.sharegpt import first_human_turns, is_heldout, iter_conversations, split_prompts

REPLIES = ReplyConfig(max_new_tokens=20, reply_batch_size=4, generator="hf")


def _conversation(i, first_role="human", text=None):
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": first_role, "value": text if text is not None else f"q{i}"},
            {"from": "gpt", "value": "a"},
        ],
    }


def test_truncated_sharegpt_file_yields_its_complete_conversations(tmp_path):
    items = [_conversation(0), _conversation(1, "gpt"), _conversation(2, text="  "), _conversation(3)]
    text = json.dumps(items)
    cut = text[: text.rindex('"q3"') + 2]  # cut inside the last conversation's string, as the shipped file is
    path = tmp_path / "sharegpt.json"
    path.write_text(cut)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut)
    assert [c["id"] for c in iter_conversations(path)] == ["c0", "c1", "c2"]
    assert [p.conversation_id for p in first_human_turns(path)] == ["c0"]  # gpt-first and blank turns dropped


@pytest.mark.parametrize("cut_after", ['"q3', '"q3"', '"q3"}, ', '"value": ', '{"id": "c3"', '"a"}]}, '])
def test_every_cut_at_the_end_is_a_truncated_tail(tmp_path, cut_after):
    """Wherever the file's end cuts the last element (inside a string, after a value or a key, between elements),
    the complete ones are read."""
    text = json.dumps([_conversation(0), _conversation(1), _conversation(3)])
    path = tmp_path / "cut.json"
    path.write_text(text[: text.rindex(cut_after) + len(cut_after)])
    assert [c["id"] for c in iter_conversations(path)] == ["c0", "c1"]


def test_a_syntax_error_before_the_end_is_refused_not_taken_for_a_cut(tmp_path):
    """A broken element in the middle of a file that does not close its array (issue 47: 6 of 40 prompts, exit 0)."""
    text = json.dumps([_conversation(i) for i in range(40)])
    broken = text.replace('"c6", "conversations"', '"c6" "conversations"')[:-1]  # missing ':' ... no closing ']'
    path = tmp_path / "broken.json"
    path.write_text(broken)
    with pytest.raises(SpecError, match=r"broken\.json: not valid JSON at line 1, column \d+"):
        list(iter_conversations(path))


def test_two_concatenated_arrays_are_refused_not_half_read(tmp_path):
    path = tmp_path / "both.json"
    path.write_text(json.dumps([_conversation(0)]) + "\n" + json.dumps([_conversation(1)]))
    with pytest.raises(SpecError, match=r"more data after the conversations array closes \(line 2.*two JSON arrays"):
        list(iter_conversations(path))


def test_no_usable_conversation_is_one_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([_conversation(0, "gpt")]))
    with pytest.raises(SpecError, match="non-empty human turn"):
        first_human_turns(path)
    path.write_text('{"not": "an array"}')
    with pytest.raises(SpecError, match="JSON array"):
        list(iter_conversations(path))


def test_split_is_by_conversation_id_and_stable(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps([_conversation(i) for i in range(400)]))
    prompts = first_human_turns(path)
    train, heldout = split_prompts(prompts)
    assert {p.conversation_id for p in train}.isdisjoint(p.conversation_id for p in heldout)
    assert 0 < len(heldout) < 60 and len(train) + len(heldout) == 400
    assert [p.conversation_id for p in heldout] == [p.conversation_id for p in prompts if is_heldout(p.conversation_id)]


def test_dflash_layer_choice_matches_its_published_checkpoints():
    assert dflash_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B drafter
    assert dflash_target_layer_ids(30, 3) == [1, 14, 27]  # what the SmolLM2 drafters use
    assert dflash_target_layer_ids(30, 1) == [15]


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    target_dir, _ = save_tiny_pair(root)
    prompts = [[1 + (i * 7 + j) % 200 for j in range(3 + i % 4)] for i in range(6)]
    data = generate_replies(target_dir, prompts, root / "data", REPLIES)
    return TargetModel.load(target_dir), target_dir, prompts, data


def test_replies_are_the_targets_greedy_continuations_and_resume(distilled):
    target, target_dir, prompts, data = distilled
    sequences = load_sequences(data)
    assert len(sequences) == len(prompts) and sorted(p.name for p in data.glob("shard-*")) == [
        "shard-00000.safetensors",
        "shard-00001.safetensors",
    ]
    first = sequences.sequence(0).tolist()
    assert first[: len(prompts[0])] == prompts[0]
    expected = target.model.generate(torch.tensor([prompts[0]]), do_sample=False, max_new_tokens=20)[0].tolist()
    assert first == expected[: len(first)]
    before = (data / "shard-00000.safetensors").stat().st_mtime_ns
    generate_replies(target_dir, prompts, data, REPLIES)
    assert (data / "shard-00000.safetensors").stat().st_mtime_ns == before  # done shards are kept, not redone
    with pytest.raises(SpecError, match="other settings"):
        generate_replies(target_dir, prompts, data, REPLIES.model_copy(update={"max_new_tokens": 30}))


def test_cached_features_equal_the_targets_and_batches_stay_in_replies(distilled):
    target, _, prompts, data = distilled
    cache_features(target, data, [0, 1], batch_size=3)
    dataset = FeatureDataset.load(data, [0, 1], target.fingerprint)
    seq = dataset.sequences.sequence(2)
    _, features = target.forward(
        seq[None], torch.arange(len(seq))[None], torch.ones(1, len(seq), dtype=torch.bool), target.new_cache(), [0, 1]
    )
    start = int(dataset.sequences.offsets[2])
    torch.testing.assert_close(dataset.features[start : start + len(seq)].float(), features[0].bfloat16().float())
    usable = dataset.trainable(block_size=4, max_len=64)
    tokens, feats, anchors = dataset.batch(usable, 4, 5, 64, torch.Generator().manual_seed(0))
    for row, index in enumerate(usable):
        n = len(dataset.sequences.sequence(index))
        assert (anchors[row] >= int(dataset.sequences.prompt_lens[index])).all() and (anchors[row] + 4 <= n).all()
    with pytest.raises(SpecError, match="layer_ids"):
        FeatureDataset.load(data, [0, 2], target.fingerprint)


def test_draft_vocabulary_is_the_most_frequent_reply_tokens(distilled):
    _, _, _, data = distilled
    sequences = load_sequences(data)
    replies = torch.cat([sequences.sequence(i)[int(sequences.prompt_lens[i]) :] for i in range(len(sequences))])
    counts = torch.bincount(replies, minlength=256)
    vocab = frequent_tokens(data, 8, always=[255])
    assert 255 in vocab.tolist() and len(vocab) == 8 and vocab.tolist() == sorted(vocab.tolist())
    top = counts.argsort(descending=True)[:3].tolist()
    assert set(top) <= set(vocab.tolist()) or counts[top[-1]] == counts[vocab].min()
    assert load_file(str(data / "shard-00000.safetensors"))["tokens"].dtype == torch.int32


def test_default_layer_ids_are_distinct_on_shallow_targets():
    from portable_spec.training.drafter_shape import dflash_target_layer_ids

    assert dflash_target_layer_ids(30, 3) == [1, 14, 27] and dflash_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert dflash_target_layer_ids(4, 2) == [0, 2]  # DFlash's [1, L-3] would give [1, 1]
    with pytest.raises(SpecError, match="use --num-hidden-layers 1 or fewer, or pass --target-layer-ids"):
        dflash_target_layer_ids(2, 2)


def test_damaged_work_dir_files_are_named(tmp_path):
    from portable_spec.training.replies import Sequences, generate_replies, read_shard

    shard = tmp_path / "shard-00000.safetensors"
    save_file(
        {
            "tokens": torch.arange(4, dtype=torch.int32),
            "offsets": torch.tensor([0, 4]),
            "prompt_lens": torch.tensor([2]),
        },
        str(shard),
    )
    assert isinstance(read_shard(shard), Sequences)
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(SpecError, match=r"shard-00000\.safetensors: not a readable reply shard"):
        read_shard(shard)
    (tmp_path / "distill.json").write_text("{half")
    with pytest.raises(SpecError, match=r"distill\.json: not valid JSON"):
        generate_replies(tmp_path, [[1, 2]], tmp_path, ReplyConfig(generator="hf"))


def test_an_empty_heldout_split_is_said_not_silent(tmp_path, capsys):
    """Issue 47: a data set too small for its 5% held-out split trained with no evaluation, and said nothing."""
    from portable_spec.training.prompts import heldout_eval_prompts
    from portable_spec.training.work_dir import WorkDir

    WorkDir(tmp_path).heldout_prompts.write_text("[]")
    assert heldout_eval_prompts(tmp_path, 32) == []
    assert "holds no held-out prompt" in capsys.readouterr().out
