"""Small kernels of the order <= 4 dynamic program (triple_dp), against numpy."""

import numpy as np
from numba import njit

from latticedraft.lattice.triple_dp import _match_ls


@njit(cache=True)
def _match(lo, hi, lab, labels):
    out = np.empty(labels.shape[0], np.int64)
    base = np.empty(labels.shape[0], np.int64)
    _match_ls(lo, hi, lab, labels, labels.shape[0], out, base)
    return out


def test_match_ls_equals_searchsorted():
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 7, 16, 65, 300):
        row = np.sort(rng.choice(np.arange(1, 1000), size=n, replace=False)).astype(np.int32)
        lab = np.concatenate([[5, 9], row, [3]]).astype(np.int32)  # the row inside a larger CSR array
        labels = np.concatenate([rng.choice(row, size=min(n, 6)) if n else [], rng.integers(1, 1002, 10)])
        labels = labels.astype(np.int64)
        got = _match(2, 2 + n, lab, labels)
        pos = np.searchsorted(row, labels)
        hit = (pos < n) & (row[np.minimum(pos, max(n - 1, 0))] == labels) if n else np.zeros(len(labels), bool)
        np.testing.assert_array_equal(got, np.where(hit, pos + 2, -1))
