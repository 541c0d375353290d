"""Where commands write, and the one rule they all follow: nothing portable-spec did not write is deleted or
overwritten. An output directory is written whole (temp directory + rename) and carries a marker naming what
kind of output it is (and, for a trained drafter, which work directory made it); only an output of that kind
(and owner) is replaced without --force, and no output may equal, contain or lie inside an input, --force or not.
A work directory or an output being written is locked, so a second run on it stops at once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from portable_spec.core.spec import SpecError

OUTPUT_MARKER = ".portable-spec-output"  # JSON: {"kind": ..., "owner": ..., "shared": ...}
LOCK_FILE = ".portable-spec.lock"


def results_json(value, indent: int | None = None) -> str:
    """JSON text of a result (benchmark tables, held-out logs) as RFC 8259 has it: a figure with no value, NaN or an
    infinity (a draft slot no round reached), is null, so jq, browsers and strict parsers read every result file."""

    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [finite(x) for x in v]
        return v

    return json.dumps(finite(value), indent=indent, allow_nan=False)


def read_marker(directory: Path) -> dict | None:
    """What portable-spec recorded it wrote here, or None when it wrote nothing here."""
    marker = Path(directory) / OUTPUT_MARKER
    if not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None  # not a marker portable-spec wrote
    return data if isinstance(data, dict) and isinstance(data.get("kind"), str) else None


def write_marker(directory: Path, kind: str, owner: str | None = None) -> None:
    (Path(directory) / OUTPUT_MARKER).write_text(json.dumps({"kind": kind, "owner": owner}) + "\n")


def _resolved(path: Path) -> Path:
    try:
        return Path(path).resolve(strict=False)
    except (RuntimeError, OSError) as error:  # a symlink loop
        raise SpecError(f"{path}: cannot be resolved ({error}); it is a symlink loop, pass a real path") from None


def check_not_an_input(out: Path, inputs: tuple = ()) -> None:
    """An output equal to, inside or containing an input (symlinks resolved) is refused: writing it would change or
    delete what the command reads. Never lifted by --force."""
    target = _resolved(out)
    for source in inputs:
        if source is None:
            continue
        source = _resolved(Path(source))
        if target == source:
            relation = "is"
        elif source in target.parents:
            relation = "is inside"
        elif target in source.parents:
            relation = "contains"
        else:
            continue
        raise SpecError(
            f"output {out} {relation} the input {source}; write the output somewhere else (nothing was changed)"
        )


def check_directory_path(path: Path, label: str) -> None:
    """`path` can be a directory: neither it nor a folder above it is a file (else one line naming which)."""
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == path else f"lies under {parent}, which is a file"
            raise SpecError(f"{label} {where}; pass a directory path (nothing was changed)")


def check_output_dir(
    out_dir: Path, kind: str, inputs: tuple = (), force: bool = False, owner: str | None = None
) -> None:
    """Refuse, before any work, an output path that would destroy what portable-spec did not write here:
    - equal to, inside or containing an input (never lifted);
    - a file, or a directory under a file;
    - a non-empty directory whose marker does not say it is a previous `kind` output of the same `owner` (a
      trained drafter belongs to its work directory; an import or export owns nothing, so it never replaces a
      trained one): `force` lifts this one rule."""
    out_dir = Path(out_dir)
    check_not_an_input(out_dir, inputs)
    check_directory_path(out_dir, f"output {out_dir}")
    if out_dir.is_dir() and not force and any(out_dir.iterdir()):
        found = read_marker(out_dir)
        if found is not None and found.get("shared"):  # a user's folder portable-spec also wrote a few files into
            found = None
        if found is None or found.get("kind") != kind or found.get("owner") != owner:
            if found is None:
                held = "files portable-spec did not write"
            elif found.get("kind") != kind:
                held = f"a portable-spec {found.get('kind')} output"
            else:
                held = f"a {kind} written from {found.get('owner') or 'elsewhere'}"
            raise SpecError(
                f"output {out_dir} is not empty and holds {held}, not a previous {kind} output "
                f"{'of ' + owner if owner else ''}".rstrip()
                + "; pass a new or empty directory, or "
                "--force to replace it (nothing was changed)"
            )
    probe = out_dir.parent
    while not probe.exists():
        probe = probe.parent
    if not os.access(probe, os.W_OK):
        raise SpecError(f"output {out_dir}: {probe} is not writable; pass a directory you can write to")


def claim_output_dir(out_dir: Path, kind: str, files: tuple[str, ...], force: bool = False, inputs: tuple = ()) -> Path:
    """A folder a command writes `files` into, leaving everything else there alone (a benchmark's table, JSON and
    plot): refused when it is, is inside or holds one of the command's `inputs` (never lifted), and when one of
    those files exists and portable-spec did not write it there (a marker of `kind` says it did), unless forced."""
    out_dir = Path(out_dir)
    check_not_an_input(out_dir, inputs)
    check_directory_path(out_dir, f"output {out_dir}")
    ours = (read_marker(out_dir) or {}).get("kind") == kind if out_dir.is_dir() else True
    clashes = [name for name in files if (out_dir / name).exists()]
    if clashes and not ours and not force:
        raise SpecError(
            f"output {out_dir} holds {', '.join(clashes)}, which portable-spec did not write there; pass "
            "another folder, or --force to replace those files (nothing was changed)"
        )
    return out_dir


def mark_output_dir(out_dir: Path, kind: str, files: tuple[str, ...]) -> Path:
    """Create `out_dir` and record that portable-spec writes `files` there. In a folder that also holds other files
    the marker says so (`shared`), and the folder is never taken as a whole output that may be replaced."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    found = read_marker(out_dir) or {}
    others = [p.name for p in out_dir.iterdir() if p.name != OUTPUT_MARKER and p.name not in files]
    shared = bool(found.get("shared")) or (found.get("kind") != kind and bool(others))
    if found.get("kind") != kind or found.get("shared", False) != shared:
        (out_dir / OUTPUT_MARKER).write_text(json.dumps({"kind": kind, "owner": None, "shared": shared}) + "\n")
    return out_dir


def _readable_modes(directory: Path) -> None:
    """Files and folders as the user's umask makes them (mkdtemp gives 0700, some writers 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [directory, *directory.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def raise_write_error(path: Path, error: Exception) -> None:
    """A failed write as one line naming the output: OS errors (disk full, permissions) and the failed-write errors
    torch and safetensors raise for them; anything else passes through unchanged."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    io_failure = isinstance(error, OSError) or any(
        word in text.lower() for word in ("no space", "failed writing", "write", "i/o error", "disk quota")
    )
    if isinstance(error, SpecError) or not io_failure:
        raise error
    raise SpecError(
        f"{path}: writing failed ({text}); check free disk space and permissions; nothing half-written was left"
    ) from error


def _through_link(path: Path) -> Path:
    """An output that is a symlink is the user's link: write where it points (it keeps pointing there), never
    replace the link itself."""
    return _resolved(path) if path.is_symlink() else path


def write_file_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Run `write(tmp_path)` beside `path`, then rename it over `path`: readers never see a half-written file, and a
    failed or interrupted write leaves nothing behind. The temp name keeps the suffix (matplotlib picks the format
    from it)."""
    path = _through_link(Path(path))
    if path.is_dir():
        raise SpecError(f"{path}: is a directory; pass a file path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        try:
            write(tmp)
        except Exception as error:
            raise_write_error(path, error)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_dir_atomically(
    out_dir: Path, write: Callable[[Path], None], kind: str = "drafter", force: bool = False, owner: str | None = None
) -> Path:
    """Run `write(tmp_dir)`, then rename tmp_dir to out_dir, under a lock on out_dir; on any error or interrupt
    nothing is left at out_dir and a replaced previous output is restored. Only an empty directory or a previous
    output of the same `kind` (and owner) is replaced, unless forced (check_output_dir)."""
    out_dir = _through_link(Path(out_dir))
    check_output_dir(out_dir, kind, force=force, owner=owner)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with locked(out_dir.parent / f".{out_dir.name}{LOCK_FILE}", f"output {out_dir}"):
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            try:
                write(tmp_dir)
            except Exception as error:
                raise_write_error(out_dir, error)
            write_marker(tmp_dir, kind, owner)
            _readable_modes(tmp_dir)
            if not out_dir.exists():
                os.replace(tmp_dir, out_dir)
                return out_dir
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            try:
                os.replace(tmp_dir, out_dir)
            except BaseException as error:
                os.replace(old, out_dir)  # put the previous output back
                raise SpecError(
                    f"could not replace {out_dir} ({error}); its previous contents were restored"
                ) from error
            shutil.rmtree(old)
            return out_dir
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)


# -- locks --------------------------------------------------------------------------------------------------------
def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(lock_file: Path) -> dict | None:
    """Who holds `lock_file`: its record, or None when free or stale (left by a process of this host that no longer
    runs)."""
    try:
        other = json.loads(lock_file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        other = {}
    if other.get("host") == socket.gethostname() and isinstance(other.get("pid"), int) and not _running(other["pid"]):
        return None
    return other


def _in_use(what: str, lock_file: Path, other: dict) -> SpecError:
    return SpecError(
        f"{what} is in use by another portable-spec run (pid {other.get('pid')} on {other.get('host')}, "
        f"since {other.get('started')}: {other.get('command')}); wait for it to finish, or delete "
        f"{lock_file} if that run no longer exists"
    )


def check_unlocked(lock_file: Path, what: str) -> None:
    """Fail at once, naming the holder, when another live run holds `lock_file` (before any model loads)."""
    other = _holder(lock_file)
    if other is not None:
        raise _in_use(what, lock_file, other)


@contextmanager
def locked(lock_file: Path, what: str) -> Iterator[None]:
    """Hold `lock_file` (created exclusively, holding pid, host, command, start) while the block runs; a second
    holder fails at once naming the first. A stale lock (its process gone, same host) is taken over."""
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv)[:300],
    }
    for _ in range(2):
        try:
            handle = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            other = _holder(lock_file)
            if other is None:
                lock_file.unlink(missing_ok=True)
                continue
            raise _in_use(what, lock_file, other) from None
        with os.fdopen(handle, "w") as file:
            file.write(json.dumps(record) + "\n")
        break
    try:
        yield
    finally:
        lock_file.unlink(missing_ok=True)


WORK_DIR_KIND = "train-work-dir"


def claim_work_dir(work_dir: Path, force: bool = False) -> Path:
    """A training work directory: new, empty, or one portable-spec marked; a folder holding anything else needs
    --force (then it is marked, and only files train names are written there)."""
    work_dir = Path(work_dir)
    check_directory_path(work_dir, f"--work-dir {work_dir}")
    if work_dir.is_dir() and any(work_dir.iterdir()) and not force:
        found = read_marker(work_dir)
        if found is None or found.get("kind") != WORK_DIR_KIND:
            raise SpecError(
                f"--work-dir {work_dir}: not empty and not a portable-spec work directory; pass a new or "
                "empty directory, or --force to use it (files train writes there would be replaced)"
            )
    work_dir.mkdir(parents=True, exist_ok=True)
    if read_marker(work_dir) is None:
        write_marker(work_dir, WORK_DIR_KIND)
    return work_dir
