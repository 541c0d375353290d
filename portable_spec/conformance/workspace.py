"""What the end-to-end checks run on: random tiny models (plumbing, every kind) and the trained fixtures.

A Workspace builds the tiny models once per run under its root and memoises reference results, so the
reference backend's answer to a given question is computed once however many backends are compared to it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import torch

from portable_spec.core import fixtures
from portable_spec.core.backends import ReferenceBackend
from portable_spec.core.spec import VARIANT_KINDS
from portable_spec.core.testing import tiny_drafter, tiny_target

T = TypeVar("T")


# dflash2: 7 candidates, the most a 64-wide drafter runs in llama.cpp (b11434 packs the selector's top_k x (top_k + 1)
# lattice into one hidden-sized row: llamacpp/gguf_export.py selector_lattice_gap)
TINY_OPTIONS = {"dflash2": {"variant_options": {"selector_top_k": 7}}}


class CheckSkipped(Exception):
    """The check cannot run here; the message is the reason reported (a skip is never a pass)."""


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.reference = ReferenceBackend()
        self._memo: dict[Hashable, object] = {}

    @classmethod
    @contextmanager
    def temporary(cls) -> Iterator["Workspace"]:
        with tempfile.TemporaryDirectory(prefix="portable-spec-conformance-") as root:
            yield cls(Path(root))

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]  # type: ignore[return-value]

    def tiny_target(self) -> Path:
        return self.memo("tiny-models", self._build_tiny)

    def tiny_drafter(self, kind: str) -> Path:
        return self.tiny_target().parent / f"tiny-drafter-{kind}"

    def _build_tiny(self) -> Path:
        with torch.random.fork_rng(devices=[]):  # tiny_target seeds the global RNG; leave it as it was
            target = tiny_target(seed=0)
            target.model.save_pretrained(self.root / "tiny-target")
            for kind in VARIANT_KINDS:  # every kind, dflash2 included: random tiny drafters need no training
                tiny_drafter(target, kind, **TINY_OPTIONS.get(kind, {})).save(self.root / f"tiny-drafter-{kind}")
        return self.root / "tiny-target"


def trained_fixture(kind: str) -> tuple[Path, Path, list[list[int]]]:
    """Target dir, drafter dir and held-out prompts of the shipped fixtures, or CheckSkipped naming what is missing."""
    needed = [fixtures.target_dir(), fixtures.drafter_dir(kind), fixtures.ASSETS / "heldout_prompts.json"]
    missing = [str(path.relative_to(fixtures.ASSETS.parent.parent)) for path in needed if not path.exists()]
    if missing:
        raise CheckSkipped(
            f"trained fixtures missing ({', '.join(missing)}); build them with "
            "`python scripts/make_fixtures.py --out portable_spec/assets`"
        )
    return fixtures.target_dir(), fixtures.drafter_dir(kind), fixtures.heldout_prompts()
