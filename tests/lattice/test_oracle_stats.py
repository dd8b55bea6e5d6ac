"""Oracle paths (Figure 5/6 inputs) and draft statistics (Table 3, Figure 2)."""

from __future__ import annotations

import numpy as np
import pytest

from latticedraft.errors import InputError
from latticedraft.lattice.oracle import (accepted_length, best_accepted, oracle_accepted_by_k, oracle_path,
                                         reference_ranks)
from latticedraft.lattice.sausage import Sausage
from latticedraft.lattice.stats import h_max, max_run, repetition, slot_entropy


def _lattice():
    return Sausage.from_ragged([[5, 6, 7], [1, 2, 3], [9, 8, 4], [0, 1, 2]],
                               [[-0.1, -1, -2], [-0.2, -1, -3], [-0.3, -1, -2], [-0.1, -2, -3]])


def test_oracle_path_maximises_the_accepted_prefix():
    s = _lattice()
    ref = [6, 3, 9, 7]
    o = oracle_path(s, ref)
    assert o.accepted == 3
    np.testing.assert_array_equal(o.tokens, [6, 3, 9, 0])  # tail: top-1
    np.testing.assert_array_equal(reference_ranks(s, ref), [1, 2, 0, -1])
    np.testing.assert_array_equal(oracle_accepted_by_k(s, ref, [1, 2, 3]), [0, 1, 3])
    # brute force over all 81 paths agrees
    import itertools
    best = max(accepted_length([s.tokens[i, c] for i, c in enumerate(cand)], ref)
               for cand in itertools.product(range(3), repeat=4))
    assert best == o.accepted
    with pytest.raises(InputError, match="empty"):
        oracle_path(s, [])


def test_accepted_lengths():
    assert accepted_length([1, 2, 3], [1, 2, 4]) == 2
    assert accepted_length([1, 2], [1, 2, 3]) == 2
    assert best_accepted([[1, 9, 9], [1, 2, 9]], [1, 2, 3]) == 2


def test_repetition_statistics():
    assert max_run([4, 4, 4, 1, 1]) == 3 and max_run([1, 2, 3]) == 1 and max_run([]) == 0
    r = repetition([[4, 4, 4, 1], [1, 2, 3, 3]])
    assert r.pairs == 6 and r.pct_consecutive == pytest.approx(100 * 3 / 6)
    assert r.mean_max_run == pytest.approx(2.5)


def test_slot_entropy_and_h_max():
    logits = np.stack([np.zeros(8), np.log([0.5, 0.5, 1e-12, 1e-12, 1e-12, 1e-12, 1e-12, 1e-12])])
    e = slot_entropy(logits)
    np.testing.assert_allclose(e, [np.log(8), np.log(2)], atol=1e-6)
    assert h_max([0.5, 1.0, 1.0, 0.7, 2.0]) == 3
    assert h_max([2.0]) == 1
