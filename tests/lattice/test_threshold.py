"""Static, Otsu and back-off pruning; Otsu cross-checked against plain numpy."""

from __future__ import annotations

import numpy as np
import pytest

from latticedraft.errors import InputError
from latticedraft.lattice.sausage import Sausage
from latticedraft.lattice.threshold import (backoff, backoff_depth, blur3, otsu_keep, otsu_threshold,
                                            prune, quantize, static_threshold)


def numpy_otsu(img: np.ndarray) -> int:
    """Otsu's method on a uint8 image: the t maximising the between-class variance of
    {x <= t} and {x > t} (first maximum; classes must be non-empty), as in OpenCV."""
    hist = np.bincount(img.ravel(), minlength=256).astype(np.float64)
    p = hist / hist.sum()
    levels = np.arange(256, dtype=np.float64)
    w0 = np.cumsum(p)
    m0 = np.cumsum(p * levels)
    mu = m0[-1]
    w1 = 1.0 - w0
    eps = np.finfo(np.float32).eps
    valid = (np.minimum(w0, w1) >= eps) & (np.maximum(w0, w1) <= 1.0 - eps)
    sigma = np.where(valid, (mu * w0 - m0) ** 2 / np.where(valid, w0 * w1, 1.0), -1.0)
    return int(np.argmax(sigma)) if valid.any() else 0


def test_otsu_matches_a_numpy_implementation():
    rng = np.random.default_rng(0)
    agree = 0
    for trial in range(300):
        k = int(rng.integers(2, 33))
        p = np.sort(rng.dirichlet(np.full(k, rng.uniform(0.05, 2.0))))[::-1]
        for blur in (False, True):
            t, keep = otsu_keep(p, blur=blur)
            img = quantize(blur3(p) if blur else p)
            if img.min() == img.max():
                assert keep.all()
                continue
            assert t == numpy_otsu(img)
            ref = img > numpy_otsu(img)
            ref[0] = True
            np.testing.assert_array_equal(keep, ref)
            agree += 1
    assert agree > 400


def test_blur_is_the_fixed_kernel_with_replicated_borders():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    ref = np.convolve(np.pad(p, 1, mode="edge"), [0.25, 0.5, 0.25], mode="valid")
    np.testing.assert_allclose(blur3(p), ref, rtol=1e-6)


def _sausage(probs):
    toks = [list(range(len(r))) for r in probs]
    return Sausage.from_ragged(toks, [np.log(np.asarray(r, dtype=np.float64)) for r in probs])


def test_static_threshold_keeps_the_best_arc_of_every_slot():
    s = _sausage([[0.6, 0.3, 0.1], [0.05, 0.04, 0.01], [0.9, 0.02]])
    t = static_threshold(s, 0.2)
    np.testing.assert_array_equal(t.widths, [2, 1, 1])  # slot 1 all below: keep its best
    assert t.h == 3 and t.tokens[1, 0] == 0
    with pytest.raises(InputError, match="eps = 1.5"):
        static_threshold(s, 1.5)


def test_otsu_separates_a_clear_gap_and_keeps_a_flat_slot():
    s = _sausage([[0.45, 0.44, 0.03, 0.02, 0.01], [0.2, 0.2, 0.2, 0.2, 0.2]])
    t = otsu_threshold(s)
    np.testing.assert_array_equal(t.widths, [2, 5])
    tb = otsu_threshold(s, blur=True)
    assert tb.widths[1] == 5 and 1 <= tb.widths[0] <= 3


def test_backoff_cuts_at_the_first_unconfident_slot():
    s = _sausage([[0.9, 0.1], [0.6, 0.4], [0.2, 0.1], [0.95, 0.05]])
    assert backoff_depth(s, 0.5) == 2
    assert backoff(s, 0.5).h == 2
    assert backoff(s, 0.99).h == 1  # never empty
    assert backoff(s, 0.0).h == 4


def test_prune_applies_static_then_otsu_then_backoff():
    s = _sausage([[0.5, 0.45, 0.03, 0.02], [0.3, 0.3, 0.2, 0.2], [0.1, 0.05, 0.05, 0.01]])
    t = prune(s, eps=0.025, otsu=True, eps_b=0.2)
    assert t.h == 2
    np.testing.assert_array_equal(t.widths, [2, 2])
