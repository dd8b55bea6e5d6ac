"""The two data structures of lookahead decoding (Fu et al. 2024, section 3): the 2-D Jacobi
window of the lookahead branch and the n-gram pool the verification branch draws from.

``JacobiWindow`` holds up to N-1 *levels* (past Jacobi iterates, oldest first), each of W
tokens. Token (l, j) of level l, column j sits ``l + 1 + j`` positions after the root and sees
the root, level 0's columns 0..j and the tokens (1..l, j) above it: a causal chain with one
token per position, so red 6 of Figure 2(b) sees orange 1-4, green 5 and itself. The target's
argmax after the last level's column j is the new guess for position ``L + 1 + j`` (L levels);
while fewer than N-1 levels exist (the warm-up) it becomes a new level, afterwards column j
yields the n-gram (level 0[j], ..., level N-2[j], new[j]) and the window drops level 0 and
appends the new guesses (positions shift by one: one token is emitted per step at least).

``NgramPool`` maps a first token to at most G continuations (int64[N-1]), least recently
added or matched first out.

    >>> pool = NgramPool(G=2)
    >>> for g in ([1, 2, 3], [1, 4, 5], [1, 2, 3], [1, 6, 7]): pool.add(np.array(g))
    >>> [c.tolist() for c in pool.get(1)]                # most recent first; [4, 5] evicted
    [[6, 7], [2, 3]]
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from latticedraft.errors import InputError
from latticedraft.gpu.verify.side_branch import SideBranch


class NgramPool:
    """first token -> up to ``G`` continuations (LRU); ``G = 0`` keeps nothing."""

    def __init__(self, G: int):
        if G < 0:
            raise InputError(f"--pool {G}: the pool size per key must be >= 0")
        self.G = int(G)
        self.table: dict[int, OrderedDict] = {}

    def add(self, ngram: np.ndarray) -> None:
        """Insert (or refresh) one n-gram, int64[n] with n >= 2."""
        if self.G == 0:
            return
        key, cont = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        entry = self.table.setdefault(key, OrderedDict())
        if cont in entry:
            entry.move_to_end(cont)
            return
        entry[cont] = None
        if len(entry) > self.G:
            entry.popitem(last=False)

    def seed(self, tokens: np.ndarray, n: int) -> None:
        """Add every n-gram of ``tokens`` (int64[T]) in order (prompt-as-reference)."""
        t = np.asarray(tokens, dtype=np.int64)
        for s in range(len(t) - n + 1):
            self.add(t[s : s + n])

    def get(self, key: int) -> list[np.ndarray]:
        """The continuations after ``key``, most recently added first: list of int64[N-1]."""
        entry = self.table.get(int(key))
        if not entry:
            return []
        return [np.asarray(c, dtype=np.int64) for c in reversed(entry)]

    def __len__(self) -> int:
        return sum(len(e) for e in self.table.values())


class JacobiWindow:
    """W columns x up to N-1 levels of Jacobi guesses; ``init``: int64[W], level 0 at start."""

    def __init__(self, W: int, N: int, init: np.ndarray):
        if W < 1 or N < 2:
            raise InputError(f"lookahead needs --window >= 1 and --ngram >= 2, got W={W}, N={N}")
        init = np.asarray(init, dtype=np.int64).reshape(-1)
        if len(init) != W:
            raise InputError(f"the window's first level needs {W} tokens, got {len(init)}")
        self.W, self.N = int(W), int(N)
        self.levels = [init]

    @property
    def full(self) -> bool:
        return len(self.levels) == self.N - 1

    def side(self) -> SideBranch:
        """The lookahead branch: L*W nodes, level by level; wanted = the last level's W nodes."""
        L, W = len(self.levels), self.W
        lev = np.repeat(np.arange(L), W)
        col = np.tile(np.arange(W), L)
        # (l, j) sees (0, j') for j' <= j and (m, j) for 1 <= m <= l
        sees = ((lev[None, :] == 0) & (col[None, :] <= col[:, None])) | (
            (col[None, :] == col[:, None]) & (lev[None, :] <= lev[:, None]))
        return SideBranch(np.concatenate(self.levels), lev + col + 1, sees, (L - 1) * W + np.arange(W))

    def update(self, guesses: np.ndarray) -> np.ndarray:
        """Take the target's argmax at the last level (int64[W]); returns the n-grams this step
        completed, int64[W, N] (0 rows during the warm-up)."""
        guesses = np.asarray(guesses, dtype=np.int64).reshape(-1)
        if not self.full:
            self.levels.append(guesses)
            return np.zeros((0, self.N), dtype=np.int64)
        grams = np.stack(self.levels + [guesses], axis=1)
        self.levels = self.levels[1:] + [guesses]
        return grams
