"""Session fixtures for the conformance suite: one workspace (tiny models, memoised reference results) per run, and
the outcomes it produced, so the committed-report check reuses what test_backends.py already ran."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from portable_spec.conformance.runner import Outcome
from portable_spec.conformance.workspace import Workspace


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and the machine is shared; restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("conformance"))


@pytest.fixture(scope="session")
def outcomes() -> dict[tuple[str, str], Outcome]:
    """(backend, check id) -> the outcome this session computed for it."""
    return {}
