"""Fixtures for the quantizer tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test on one torch thread: its ops are tiny, and on a shared 2-core machine a second
    thread only adds contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
