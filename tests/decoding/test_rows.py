"""``Rows``: the per-row bookkeeping of the one loop."""

import numpy as np

from latticedraft.decoding.rows import Rows


def test_a_row_admitted_later_counts_its_seconds_from_its_admission():
    r = Rows([np.array([1]), np.array([2])], max_new_tokens=2)
    r.live = [0]
    r.begun[1] = 0.0  # long before: must be reset when row 1 starts
    r.admit([1])
    assert r.live == [0, 1]
    assert r.emit(1, [5, 6]) and 0 <= r.done_at[1] < 1.0
