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


@pytest.fixture(autouse=True)
def _grad_mode_is_left_as_found():
    """A test (or the benchmark ``main`` it runs in-process) that switches autograd off globally breaks every
    training test after it; fail the culprit instead."""
    import torch

    before = torch.is_grad_enabled()
    yield
    after = torch.is_grad_enabled()
    if after != before:
        torch.set_grad_enabled(before)
        pytest.fail(f"the test left autograd {'on' if after else 'off'} (use `with torch.no_grad()`, not "
                    "torch.set_grad_enabled(False))")
