"""The measured step-cost curve T(n): interpolation, measuring on a tiny model (the verifier's
cache is left as found) and the on-disk cache keyed by the model/device/threads fingerprint."""

import numpy as np
import pytest
import torch

from latticedraft.gpu.verify import cost_model
from latticedraft.gpu.verify.cost_model import CostModel, fingerprint
from latticedraft.gpu.verify.verifier import Verifier
from tests.decoding.tiny import blockwise

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_seconds_interpolates_and_extrapolates_the_last_slope():
    cm = CostModel((1, 2, 4), (1.0, 1.5, 2.5))
    assert cm.seconds(3) == pytest.approx(2.0)
    assert cm.seconds(6) == pytest.approx(3.5)
    assert np.allclose(cm.seconds(np.array([1, 2, 4])), [1.0, 1.5, 2.5])
    assert CostModel.from_json(cm.to_json()) == cm


def test_measure_covers_the_grid_and_leaves_the_cache_empty():
    v = Verifier(blockwise("llama", torch.float32, num_heads=3))
    cm = CostModel.measure(v, batch=2, context=20, grid=(1, 3, 7), repeats=2)
    assert cm.nodes == (1, 3, 7) and all(s > 0 for s in cm.seconds_at)
    assert cm.info["batch"] == 2


def test_measure_stops_repeating_at_its_time_budget():
    """A model whose rounds take seconds (135 M parameters on a CPU) measures min_repeats rounds, not 15."""
    v = Verifier(blockwise("llama", torch.float32, num_heads=3))
    assert CostModel.measure(v, context=20, grid=(1, 3), repeats=15, budget_s=0.0, min_repeats=3).info["repeats"] == 3
    assert CostModel.measure(v, context=20, grid=(1, 3), repeats=6, budget_s=1e9).info["repeats"] == 6


def test_cached_measures_once_per_fingerprint(tmp_path, monkeypatch):
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path))
    v = Verifier(blockwise("gpt2", torch.float32, num_heads=3))
    calls = []
    real = CostModel.measure.__func__

    def counting(cls, verifier, batch=1, **kw):
        calls.append(batch)
        return real(cls, verifier, batch=batch, context=10, grid=(1, 2), repeats=1)

    monkeypatch.setattr(CostModel, "measure", classmethod(counting))
    a = CostModel.cached(v, batch=1)
    b = CostModel.cached(v, batch=1)
    assert calls == [1] and a == b and a.key == fingerprint(v, 1)
    assert (tmp_path / "cost_model" / f"{a.key}.json").is_file()
    CostModel.cached(v, batch=4)
    assert calls == [1, 4] and fingerprint(v, 4) != fingerprint(v, 1)
    (tmp_path / "cost_model" / f"{a.key}.json").write_text("{not json")
    CostModel.cached(v, batch=1)  # a damaged entry is measured again
    assert calls == [1, 4, 1]


def test_for_batch_interpolates_between_measured_sizes_and_measures_outside_them(tmp_path, monkeypatch):
    """A partial batch between the stored sizes costs no measurement; a size with stored curves on
    one side only is measured (a batch-4 curve is never used for batch 1)."""
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path))
    v = Verifier(blockwise("gpt2", torch.float32, num_heads=3))
    calls = []

    def fake(cls, verifier, batch=1, **kw):
        calls.append(batch)
        return CostModel((1, 2, 8), (1.0 * batch, 2.0 * batch, 4.0 * batch))

    monkeypatch.setattr(CostModel, "measure", classmethod(fake))
    assert CostModel.for_batch(v, 4).seconds(2) == 8.0 and calls == [4]
    assert CostModel.for_batch(v, 1).seconds(2) == 2.0 and calls == [4, 1]
    mid = CostModel.for_batch(v, 3)
    assert calls == [4, 1] and mid.seconds(8) == pytest.approx(12.0) and mid.info["interpolated"]["from"] == [1, 4]
    assert CostModel.for_batch(v, 4).seconds(8) == 16.0 and calls == [4, 1]
    CostModel.for_batch(v, 6)
    assert calls == [4, 1, 6]


def test_fingerprint_follows_threads_and_draft_vocab():
    m = blockwise("gpt2", torch.float32, num_heads=3)
    plain, reduced = Verifier(m), Verifier(m, draft_vocab=np.arange(10))
    assert fingerprint(plain, 1) != fingerprint(reduced, 1)
    before = fingerprint(plain, 1)
    torch.set_num_threads(2)
    try:
        assert fingerprint(plain, 1) != before
    finally:
        torch.set_num_threads(1)
    assert cost_model.describe(plain, 1)["threads"] == 1


def test_monotone_is_the_nondecreasing_least_squares_fit():
    assert cost_model.monotone([1, 3, 2, 4]) == [1, 2.5, 2.5, 4]
    assert cost_model.monotone([5, 1, 1, 9]) == pytest.approx([7 / 3] * 3 + [9])
    assert cost_model.monotone([1, 2, 3]) == [1, 2, 3]
