"""The portable-spec side of the oracle: inputs out, the upstream package's own answers back.

Each upstream package runs in a venv of its own (its pins differ from ours and from each other's):
`$PORTABLE_SPEC_UPSTREAM_VENVS/<package>/bin/python` (default `.venv-upstream/` in the working directory), built by
`.ci/upstream_oracle_tests.sh`. One worker call per package runs all of its cases (worker.py); without the venv the
checks are skipped with the command that builds it.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from portable_spec.conformance.upstream_oracle.cases import CONTEXT, LAYER_IDS, PACKAGES, UpstreamCase, cases_of
from portable_spec.conformance.workspace import CheckSkipped, trained_fixture
from portable_spec.core.target import TargetModel

VENVS_VARIABLE = "PORTABLE_SPEC_UPSTREAM_VENVS"
WORKER = Path(__file__).with_name("worker.py")
WORKER_TIMEOUT = 900  # seconds for one package's cases (a cold import of torch + transformers is ~10 s)


def venv_python(package: str) -> Path:
    """The upstream venv's interpreter, or CheckSkipped saying how to build it."""
    root = Path(os.environ.get(VENVS_VARIABLE, ".venv-upstream"))
    python = root / package / "bin" / "python"
    if not python.is_file():
        version, pins = PACKAGES[package]
        raise CheckSkipped(
            f"no {package} {version} venv at {root / package} ({pins}); build the upstream venvs with "
            f"`bash .ci/upstream_oracle_tests.sh` (or point {VENVS_VARIABLE} at them)"
        )
    return python


@dataclass(frozen=True)
class OracleInputs:
    """What both sides run on: the fixture target's features of a held-out prompt's first CONTEXT tokens, and a
    block of [anchor = the next token, MASK...]."""

    target: Path
    features: torch.Tensor  # [1, CONTEXT, len(LAYER_IDS) * H]
    prompt: list[int]  # the held-out prompt (the decode case decodes it whole)
    anchor: int
    vocab_size: int  # the target's

    def true_tokens(self, count: int) -> torch.Tensor:
        """[1, count] the prompt's own tokens from the anchor on (a DSpark's teacher-forced previous tokens)."""
        return torch.tensor([self.prompt[CONTEXT : CONTEXT + count]])


def oracle_inputs() -> OracleInputs:
    target_dir, _, prompts = trained_fixture("parallel")
    prompt = prompts[0]
    target = TargetModel.load(target_dir)
    ids = torch.tensor([prompt[:CONTEXT]])
    positions = torch.arange(CONTEXT)[None]
    with torch.no_grad():
        _, features = target.forward(
            ids, positions, torch.ones_like(ids, dtype=torch.bool), target.new_cache(), LAYER_IDS
        )
    return OracleInputs(target_dir, features.float(), prompt, prompt[CONTEXT], target.config.vocab_size)


def block_ids(case: UpstreamCase, inputs: OracleInputs) -> torch.Tensor:  # [1, k]
    return torch.tensor([[inputs.anchor] + [1] * (case.block_size - 1)])


def draft_vocabulary(size: int, vocab: int) -> torch.Tensor:
    """A seeded reduced vocabulary: `size` distinct target ids, sorted (speculators' d2t order)."""
    return torch.randperm(vocab, generator=torch.Generator().manual_seed(size))[:size].sort().values


@dataclass(frozen=True)
class OracleAnswer:
    """One case's upstream result: the checkpoint its project saved, its logits per slot, what it ran."""

    checkpoint: Path
    logits: torch.Tensor  # [1, k, V] float32
    info: dict
    drafts: torch.Tensor | None = None  # [1, n]: a DFlash2's selector or a DSpark's Markov chain picks (greedy)
    confidence: torch.Tensor | None = None  # [1, k]: a DSpark's confidence logits, teacher-forced


def run_loaded(
    package: str, directory: Path, block_size: int, own: dict, inputs: OracleInputs, root: Path
):  # fmt: skip
    """A directory written elsewhere (portable-spec's `export speculators`) read and run by the package's own classes
    (worker.load_saved_speculator) on the oracle inputs: its OracleAnswer."""
    python = venv_python(package)
    out = root / package / "loaded"
    out.mkdir(parents=True, exist_ok=True)
    block = torch.tensor([[inputs.anchor] + [1] * (block_size - 1)])
    tensors = {
        "features": inputs.features.contiguous(),
        "block_ids": block,
        "true_tokens": inputs.true_tokens(block_size),
    }
    save_file(tensors, str(out / "inputs.safetensors"))
    case = {"name": "loaded", "load": str(directory), **own, "out": str(out)}
    request = root / package / "loaded-request.json"
    request.write_text(
        json.dumps(
            {
                "package": package,
                "target_dir": str(inputs.target),
                "cases": [{**case, "inputs": str(out / "inputs.safetensors")}],
            }
        )
    )
    _run_worker(python, request, package)
    tensors = load_file(str(out / "oracle.safetensors"))
    info = json.loads((out / "oracle.json").read_text())
    return OracleAnswer(directory, tensors["logits"], info, tensors.get("drafts"), tensors.get("confidence"))


def _run_worker(python: Path, request: Path, package: str) -> None:
    done = subprocess.run(
        [str(python), str(WORKER), str(request)],
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"{package}'s worker failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")


def run_package(package: str, inputs: OracleInputs, root: Path) -> dict[str, OracleAnswer]:
    """Every case of `package` through its own code in its venv: case name -> OracleAnswer."""
    python = venv_python(package)
    _, drafter_dir, _ = trained_fixture("parallel")
    cases = []
    for index, case in enumerate(cases_of(package)):
        out = root / package / case.name
        out.mkdir(parents=True, exist_ok=True)
        tensors = {"features": inputs.features, "block_ids": block_ids(case, inputs)}
        if case.dspark or case.domino:
            tensors["true_tokens"] = inputs.true_tokens(case.block_size)
        if case.decode:
            tensors["prompt_ids"] = torch.tensor([inputs.prompt])
        if case.draft_vocab:
            tensors["draft_ids"] = draft_vocabulary(case.draft_vocab, inputs.vocab_size)
        save_file({name: t.contiguous() for name, t in tensors.items()}, str(out / "inputs.safetensors"))
        described = {**case.drafter(seed=1000 + index), "out": str(out), "inputs": str(out / "inputs.safetensors")}
        # the trained fixture drafter's weights in every case, so acceptance means something on backends that
        # only decode (a random drafter accepts nothing, whatever function it computes)
        described["weights"] = str(drafter_dir / "model.safetensors")
        cases.append(described)
    request = root / package / "request.json"
    request.write_text(json.dumps({"package": package, "target_dir": str(inputs.target), "cases": cases}))
    _run_worker(python, request, package)
    answers = {}
    for case in cases:
        out = Path(case["out"])
        tensors = load_file(str(out / "oracle.safetensors"))
        info = json.loads((out / "oracle.json").read_text())
        answers[case["name"]] = OracleAnswer(
            out / "checkpoint", tensors["logits"], info, tensors.get("drafts"), tensors.get("confidence")
        )
    return answers
