"""The losses' tests' fixture (the shared helpers they import are in checks.py and oracles.py, beside
this file; tests/conftest.py holds the fixtures every test can use)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def keep_the_global_generator():
    """Tests seed torch's global generator (make() does); the seeding stays inside the test."""
    with torch.random.fork_rng(devices=[]):
        yield
