"""Draft vocabulary ranking: most frequent first, ties by id, written and read back; bad sizes
and files name the fix."""

import numpy as np
import pytest

from latticedraft.gpu.models.draft_vocab import FILE, load_ranked, rank_tokens, trained_size, write_ranked
from latticedraft.errors import InputError


def test_rank_by_frequency_then_id():
    assert rank_tokens(np.array([5, 3, 5, 1, 3, 5, 7]), 10).tolist() == [5, 3, 1, 7]


def test_round_trip_and_errors(tmp_path):
    write_ranked(tmp_path, np.array([2, 2, 4, 4, 4, 0]), 8, "toy")
    assert load_ranked(tmp_path, 2).tolist() == [4, 2]
    with pytest.raises(InputError, match="exceeds the 3 tokens"):
        load_ranked(tmp_path, 4)
    with pytest.raises(InputError, match=">= 1"):
        load_ranked(tmp_path, 0)
    with pytest.raises(InputError, match="needs"):
        load_ranked(tmp_path / "missing", 2)
    (tmp_path / FILE).write_text("garbage")
    with pytest.raises(InputError, match="not a draft vocabulary file"):
        load_ranked(tmp_path, 2)


def test_trained_size_is_recorded_beside_the_ranking(tmp_path):
    write_ranked(tmp_path / "a", np.array([2, 2, 4, 4, 4, 0]), 8, "toy", trained=2)
    write_ranked(tmp_path / "b", np.array([2, 2, 4]), 8, "toy")
    assert trained_size(tmp_path / "a") == 2 and load_ranked(tmp_path / "a", 3).tolist() == [4, 2, 0]
    assert trained_size(tmp_path / "b") is None and trained_size(tmp_path / "missing") is None
    (tmp_path / "b" / FILE).write_text("garbage")
    assert trained_size(tmp_path / "b") is None  # load_ranked is the one that refuses it
