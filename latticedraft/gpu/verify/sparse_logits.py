"""``SparseLogits``: logits [m, V] kept as their listed entries, every other one -inf.

The screened projections (``screened_argmax``, ``screened_topk``) compute float32 logits only
for the tokens that can matter; sampling (``SamplingOptions.probs``) reads them entry by entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class SparseLogits:
    """Logits [m, V] given by their listed entries, every other one -inf: ``rows`` int64[c]
    (ascending), ``tokens`` int64[c] (distinct within a row), ``values`` float[c] (the model's
    float dtype), ``shape`` (m, V). What ``TopKProjection`` returns, and what
    ``SamplingOptions.probs`` reads without building the [m, V] tensor."""

    rows: np.ndarray
    tokens: np.ndarray
    values: np.ndarray
    shape: tuple

    def __len__(self) -> int:
        return int(self.shape[0])

    def dense(self) -> torch.Tensor:
        """The logits as a tensor [m, V] (the values' dtype)."""
        vals = torch.from_numpy(self.values)
        out = torch.full(self.shape, float("-inf"), dtype=vals.dtype)
        out[torch.from_numpy(self.rows), torch.from_numpy(self.tokens)] = vals
        return out

    def bounds(self) -> np.ndarray:
        """int64[m + 1]: row i's entries are ``[bounds[i], bounds[i + 1])``."""
        return np.searchsorted(self.rows, np.arange(len(self) + 1))

    def split(self) -> list:
        """One single-row ``SparseLogits`` per row."""
        e = self.bounds()
        return [SparseLogits(np.zeros(e[i + 1] - e[i], dtype=np.int64), self.tokens[e[i]:e[i + 1]],
                             self.values[e[i]:e[i + 1]], (1, self.shape[1])) for i in range(len(self))]

    @staticmethod
    def stack(parts: list) -> "SparseLogits":
        """The rows of ``parts`` (each ``SparseLogits``), in order, as one."""
        sizes = [len(p) for p in parts]
        offsets = np.cumsum([0] + sizes[:-1])
        return SparseLogits(np.concatenate([p.rows + o for p, o in zip(parts, offsets)]),
                            np.concatenate([p.tokens for p in parts]), np.concatenate([p.values for p in parts]),
                            (int(sum(sizes)), parts[0].shape[1]))

    def argmax(self) -> np.ndarray:
        """Each row's largest logit's token, the lowest id among ties (``torch.argmax``'s rule
        on the dense logits): int64[m]. Every row lists at least one entry."""
        first = np.lexsort((self.tokens, -self.values, self.rows))
        keep = np.ones(len(first), dtype=bool)
        keep[1:] = self.rows[first][1:] != self.rows[first][:-1]
        return self.tokens[first][keep].astype(np.int64)
