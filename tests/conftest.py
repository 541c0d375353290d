import pytest
import torch

from portable_spec import fixtures


@pytest.fixture(autouse=True, scope="session")
def _few_threads():
    torch.set_num_threads(2)


requires_fixtures = pytest.mark.skipif(
    not (fixtures.target_dir() / "config.json").exists(),
    reason="trained fixtures missing: run `python scripts/make_fixtures.py --out portable_spec/assets`",
)
