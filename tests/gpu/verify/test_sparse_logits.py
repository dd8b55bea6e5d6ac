"""``SparseLogits``: listed entries as the dense logits they stand for."""

import numpy as np
import torch

from latticedraft.gpu.verify.sparse_logits import SparseLogits


def test_sparse_logits_dense_split_stack_and_argmax():
    s = SparseLogits(np.array([0, 0, 1, 1, 1]), np.array([4, 2, 0, 3, 1]),
                     np.array([1.0, 2.0, 5.0, 5.0, -1.0], dtype=np.float32), (2, 6))
    d = s.dense()
    assert d.shape == (2, 6) and d[0, 2] == 2.0 and d[0, 0] == float("-inf") and d[1, 3] == 5.0
    assert s.argmax().tolist() == d.argmax(-1).tolist() == [2, 0]  # a tie: the lowest id, as torch.argmax
    parts = s.split()
    assert [len(p) for p in parts] == [1, 1] and parts[1].tokens.tolist() == [0, 3, 1]
    again = SparseLogits.stack([parts[1], parts[0], parts[1]])
    assert torch.equal(again.dense(), d[[1, 0, 1]])
    assert again.bounds().tolist() == [0, 3, 5, 8]
