import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    torch.set_num_threads(2)


@pytest.fixture
def one_thread():
    """One torch thread for a test (tiny models run fastest so on a shared machine); restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
