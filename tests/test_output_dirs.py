"""Writers never destroy what portable-spec did not write: exports into the drafter, the target or a user's folder
are refused before any work, and a replaced previous output of the same kind is the only thing ever replaced."""

import hashlib
from pathlib import Path

import pytest

from portable_spec.cli import main
from portable_spec.core.outputs import read_marker, write_dir_atomically
from portable_spec.core.spec import SpecError
from portable_spec.core.testing import save_tiny_pair


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
    assert read_marker(out)["kind"] == "onnx-export"
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


# -- ownership, locks, permissions, interrupts (issue: no data lost, round 2) --------------------------------------
def test_a_drafter_is_replaced_only_by_the_work_dir_that_wrote_it(tmp_path):
    out, mine, other = tmp_path / "dc", str(tmp_path / "work-a"), str(tmp_path / "work-b")
    write_dir_atomically(out, _write("a1"), kind="drafter", owner=mine)
    write_dir_atomically(out, _write("a2"), kind="drafter", owner=mine)  # a rerun of the same training
    assert (out / "out.txt").read_text() == "a2" and read_marker(out) == {"kind": "drafter", "owner": mine}
    with pytest.raises(SpecError, match="holds a drafter written from .*work-a"):
        write_dir_atomically(out, _write("b"), kind="drafter", owner=other)
    assert (out / "out.txt").read_text() == "a2"
    write_dir_atomically(out, _write("b"), kind="drafter", owner=other, force=True)
    assert read_marker(out)["owner"] == other


def test_outputs_are_written_with_the_users_umask_modes(tmp_path):
    import os
    import stat

    out = write_dir_atomically(tmp_path / "o", _write("x"), kind="drafter")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    for name in ("out.txt", ".portable-spec-output"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask, name


def test_a_second_holder_of_a_lock_stops_at_once_and_a_stale_lock_is_taken_over(tmp_path):
    import json
    import socket
    import subprocess
    import sys

    from portable_spec.core.outputs import check_unlocked, locked
    from portable_spec.training.work_dir import WorkDir

    lock = WorkDir(tmp_path).data_lock
    with locked(lock, "--work-dir W"):
        assert json.loads(lock.read_text())["pid"] > 0
        with pytest.raises(SpecError, match=r"--work-dir W is in use by another portable-spec run \(pid \d+ on "):
            check_unlocked(lock, "--work-dir W")
        with pytest.raises(SpecError, match="in use by another portable-spec run"):
            with locked(lock, "--work-dir W"):
                pass
    assert not lock.exists()  # released
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    check_unlocked(lock, "--work-dir W")  # its process is gone: stale
    with locked(lock, "--work-dir W"):  # and taken over
        assert json.loads(lock.read_text())["pid"] != int(dead.stdout)


def test_two_runs_on_one_work_dir_train_different_outputs_but_never_the_same(tmp_path):
    """Kinds may train at once on shared data (each its own state and loss log); the same output may not."""
    from portable_spec.core.outputs import locked
    from portable_spec.training.work_dir import WorkDir

    with locked(WorkDir(tmp_path).training_lock("depth_causal"), "training depth_causal"):
        with locked(WorkDir(tmp_path).training_lock("parallel"), "training parallel"):
            pass
        with pytest.raises(SpecError, match="training depth_causal is in use"):
            with locked(WorkDir(tmp_path).training_lock("depth_causal"), "training depth_causal"):
                pass


def test_a_users_folder_is_used_as_work_dir_only_with_force(tmp_path):
    from portable_spec.core.outputs import WORK_DIR_KIND, claim_work_dir

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="not a portable-spec work directory"):
        claim_work_dir(tmp_path)
    claim_work_dir(tmp_path, force=True)
    assert read_marker(tmp_path)["kind"] == WORK_DIR_KIND and (tmp_path / "notes.txt").read_text() == "mine"


def test_ctrl_c_ends_a_command_with_one_line_and_leaves_nothing_half_written(tmp_path, monkeypatch, capsys):
    """An interrupt inside a write: exit 130, one `error:` line, no output directory and no temp files left."""
    target, drafter = save_tiny_pair(tmp_path / "in")
    capsys.readouterr()

    def half_written(tmp: Path) -> None:
        (tmp / "model.onnx").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(
        "portable_spec.adapters.onnx_export.export_onnx",
        lambda *a, **k: write_dir_atomically(tmp_path / "out", half_written, kind="onnx-export"),
    )
    assert main(["export", "onnx", str(drafter), str(tmp_path / "out"), "--target", str(target)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: interrupted; outputs are written whole or not at all, so nothing half-written was left"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_users_folder_with_a_benchmark_in_it_is_still_the_users(tmp_path):
    """bench writes its files into a user's folder and leaves the rest; that folder never becomes a whole output a
    later command may replace."""
    from portable_spec.core.outputs import claim_output_dir, mark_output_dir

    (tmp_path / "notes.txt").write_text("mine")
    claim_output_dir(tmp_path, "bench", ("benchmarks.md",))
    mark_output_dir(tmp_path, "bench", ("benchmarks.md",))
    (tmp_path / "benchmarks.md").write_text("table")
    claim_output_dir(tmp_path, "bench", ("benchmarks.md",))  # its own file: a rerun may replace it
    with pytest.raises(SpecError, match="holds files portable-spec did not write"):
        write_dir_atomically(tmp_path, _write("x"), kind="bench")
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_full_disk_names_the_output_and_leaves_nothing(tmp_path):
    import errno

    def full(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SpecError, match=r"/o: writing failed \(.*No space left on device\); check free disk"):
        write_dir_atomically(tmp_path / "o", full, kind="onnx-export")
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_target_cache_manifest_is_rebuilt_not_an_error(tmp_path):
    from portable_spec.core.real_target import MANIFEST, _manifest_ok

    (tmp_path / MANIFEST).write_text("{half")
    assert _manifest_ok(tmp_path, "sha256:x") is False


def test_an_output_that_is_a_symlink_stays_the_users_link(tmp_path):
    """Written through: the link keeps pointing where it did, and what it points to holds the new output."""
    from portable_spec.core.outputs import write_dir_atomically, write_file_atomically

    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real, target_is_directory=True)
    for text in ("first", "second"):  # an empty target, then replacing our own previous output through the link
        write_dir_atomically(link, lambda tmp, text=text: (tmp / "out.txt").write_text(text), kind="bench")
        assert link.is_symlink() and link.resolve() == real.resolve()
        assert (real / "out.txt").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]  # nothing renamed away or left behind
    target, file_link = tmp_path / "table.md", tmp_path / "table-link.md"
    target.write_text("old")
    file_link.symlink_to(target)
    write_file_atomically(file_link, lambda tmp: tmp.write_text("new"))
    assert file_link.is_symlink() and target.read_text() == "new"
