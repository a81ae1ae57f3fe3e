"""One-shot pruner tests: one torch thread (the tiny Llama and its ids are fixtures of tests/conftest.py)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """One torch thread: the ops are tiny, and on a shared 2-core machine a second thread only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
