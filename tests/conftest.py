import os
import re

import pytest
import torch

# Markers of tests that need what only their own CI stage builds (an engine's venv, a GPU, the upstream packages'
# venvs, the llama.cpp build): deselected unless the -m expression names them (`-m upstream`, `-m llamacpp`), so
# that `pytest -m "not slow"` is the development loop it says and the README's plain command runs the rest
STAGES = ("engine", "gpu", "upstream", "llamacpp")


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    # two cores: two torch threads in one process, or one per process when pytest-xdist runs two (-n 2)
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture
def one_thread():
    """One torch thread for a test (tiny models run fastest so on a shared machine); restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(config, items):
    """The `slow` rule's SmolLM2 part in one place (a `real_target` test is slow), and the stage markers' rule."""
    named = {stage for stage in STAGES if re.search(rf"\b{stage}\b", config.getoption("markexpr") or "")}
    kept, deselected = [], []
    for item in items:
        if item.get_closest_marker("real_target") is not None:
            item.add_marker(pytest.mark.slow)
        stage = any(item.get_closest_marker(m) is not None and m not in named for m in STAGES)
        (deselected if stage else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
