"""Fixtures shared by every test directory."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_torch_thread():
    """Tiny models on a shared 2-core CPU: one intra-op thread is ~10x faster than two.

    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
