"""Writers never destroy what portable-spec did not write: exports into the drafter, the target or a user's folder
are refused before any work, and a replaced previous output of the same kind is the only thing ever replaced."""

import hashlib
from pathlib import Path

import pytest

from portable_spec.checkpoint import OUTPUT_MARKER, write_dir_atomically
from portable_spec.cli import main
from portable_spec.spec import SpecError
from portable_spec.testing import save_tiny_pair


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def _write(text):
    return lambda tmp: (tmp / "out.txt").write_text(text)


def test_only_a_previous_output_of_the_same_kind_is_replaced(tmp_path):
    out = write_dir_atomically(tmp_path / "o", _write("one"), kind="onnx-export")
    assert (out / OUTPUT_MARKER).read_text().strip() == "onnx-export"
    write_dir_atomically(out, _write("two"), kind="onnx-export")
    assert (out / "out.txt").read_text() == "two"
    with pytest.raises(SpecError, match="not a previous trtllm-export output"):
        write_dir_atomically(out, _write("three"), kind="trtllm-export")
    assert (out / "out.txt").read_text() == "two"


def test_a_users_folder_and_a_file_are_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SpecError, match="files portable-spec did not write"):
        write_dir_atomically(mine, _write("x"), kind="onnx-export")
    assert (mine / "notes.txt").read_text() == "keep me" and len(list(mine.iterdir())) == 1
    (tmp_path / "f").write_text("a file")
    with pytest.raises(SpecError, match="is a file"):
        write_dir_atomically(tmp_path / "f", _write("x"), kind="drafter")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (write_dir_atomically(empty, _write("ok")) / "out.txt").read_text() == "ok"


@pytest.mark.parametrize("into", ["drafter", "target", "user"])
def test_export_onto_an_input_or_a_users_folder_changes_nothing(tmp_path, capsys, into):
    pytest.importorskip("onnxruntime")
    target_dir, drafter_dir = save_tiny_pair(tmp_path, "depth_causal")
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    out = {"drafter": drafter_dir, "target": target_dir, "user": user}[into]
    before = {p: _digest(p) for p in (target_dir, drafter_dir, user)}
    assert main(["export", "onnx", str(drafter_dir), str(out), "--target", str(target_dir)]) != 0
    assert ("is the input" if into != "user" else "not empty") in capsys.readouterr().err
    assert {p: _digest(p) for p in before} == before
    # --force lifts only the "not ours" rule: an input is never written over, a user's folder is replaced on request
    status = main(["export", "onnx", str(drafter_dir), str(out), "--target", str(target_dir), "--force", "--no-verify"])
    if into == "user":
        assert status == 0 and (user / "drafter.onnx").exists() and not (user / "thesis.tex").exists()
    else:
        assert status == 2 and "is the input" in capsys.readouterr().err
        assert {p: _digest(p) for p in (target_dir, drafter_dir)} == {p: before[p] for p in (target_dir, drafter_dir)}
