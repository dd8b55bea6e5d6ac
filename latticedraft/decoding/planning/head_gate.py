"""Whether the next step computes head drafts at all: chosen from measured tokens per second.

Heads cost every step the same (their FFNs and projection inside the verify call, the lattice,
the p-best search, a bigger tree), whatever they end up adding. Where the text repeats itself a
context n-gram path often carries the step alone, and the heads' cost buys little. The gate
decides, before the heads are computed, between two arms, ``heads`` and ``context only``, in
buckets keyed by the longest context match of the next step's history (0 .. ``MAX_BUCKET``; in
bucket 0 "context only" is a plain one-token step, which wins where the heads do not pay for
themselves at all, as measured on the bundled model on one CPU thread): each
arm keeps running sums of the tokens its steps emitted and the wall-clock seconds they took,
and the arm with more tokens per second wins its bucket. Every arm is tried ``WARMUP`` times per
bucket first, and the losing arm again every ``EXPLORE`` decisions of a bucket so that its
estimate follows the text; old observations decay by ``DECAY`` per update. No constant here is
a cost or a rate: those are measured as the run goes. The output never changes (every draft is
verified); only the speed does.

A step's seconds miss what the heads cost the steps around it (on a CPU their weights push the
model's out of the caches, and the next step, of either arm, runs slower), so the per-bucket
choice alone can keep the heads where a run is faster without them. Above the buckets, the gate
therefore runs in blocks of ``BLOCK`` steps under one of two policies, ``gated`` (the buckets
decide) or ``off`` (no heads), and keeps each policy's decayed tokens and seconds over whole
blocks, side effects included: each policy runs one block first, then the faster one runs, and
the other again every ``EXPLORE_BLOCKS`` blocks.

    >>> g = HeadGate()
    >>> arm = g.choose(2)          # True: compute heads for the next step
    >>> g.update(2, arm, tokens=3, seconds=0.006)
"""

from __future__ import annotations

import numpy as np

MAX_BUCKET = 3
WARMUP = 2
EXPLORE = 16
DECAY = 0.95
BLOCK = 64  # steps per block of one policy
EXPLORE_BLOCKS = 8  # the slower policy runs one block in this many
BLOCK_DECAY = 0.8
GATED, OFF = 0, 1  # the policies


class HeadGate:
    """tokens, seconds: float[buckets, 2] decayed sums per (bucket, arm) with arm 1 = heads;
    steps: int[buckets, 2] updates seen; decisions: int[buckets] choices made per bucket;
    policy: ``GATED`` or ``OFF`` for the current block; block_tokens, block_seconds: float[2] decayed
    sums per policy over finished blocks; blocks: int[2] blocks finished per policy."""

    def __init__(self, buckets: int = MAX_BUCKET + 1):
        self.tokens = np.zeros((buckets, 2))
        self.seconds = np.zeros((buckets, 2))
        self.steps = np.zeros((buckets, 2), dtype=np.int64)
        self.decisions = np.zeros(buckets, dtype=np.int64)
        self.policy, self.left, self.this = GATED, BLOCK, np.zeros(2)  # this block: tokens, seconds
        self.block_tokens, self.block_seconds = np.zeros(2), np.zeros(2)
        self.blocks = np.zeros(2, dtype=np.int64)

    def bucket(self, match: int) -> int:
        return int(min(max(match, 0), self.tokens.shape[0] - 1))

    def rate(self, bucket: int) -> np.ndarray:
        """Measured tokens per second of [context only, heads] in ``bucket`` (nan where unseen)."""
        return _per_second(self.tokens[bucket], self.seconds[bucket])

    def choose(self, match: int) -> bool:
        """True to compute heads for a step whose history has a longest context match ``match``."""
        if self.policy == OFF:
            return False
        b = self.bucket(match)
        self.decisions[b] += 1
        for arm in (1, 0):
            if self.steps[b, arm] < WARMUP:
                return bool(arm)
        r = self.rate(b)
        best = int(r[1] >= r[0])
        if self.decisions[b] % EXPLORE == 0:
            return bool(1 - best)
        return bool(best)

    def update(self, match: int, heads: bool, tokens: int, seconds: float) -> None:
        """Record one step of arm ``heads`` in the bucket of ``match``: tokens emitted, seconds taken."""
        b, arm = self.bucket(match), int(heads)
        self.tokens[b, arm] = DECAY * self.tokens[b, arm] + tokens
        self.seconds[b, arm] = DECAY * self.seconds[b, arm] + seconds
        self.steps[b, arm] += 1
        self.this += (tokens, seconds)
        self.left -= 1
        if self.left == 0:
            self._next_block()

    def block_rate(self) -> np.ndarray:
        """Measured tokens per second of the [gated, off] policies over their blocks (nan: none yet)."""
        return _per_second(self.block_tokens, self.block_seconds)

    def _next_block(self) -> None:
        p = self.policy
        self.block_tokens[p] = BLOCK_DECAY * self.block_tokens[p] + self.this[0]
        self.block_seconds[p] = BLOCK_DECAY * self.block_seconds[p] + self.this[1]
        self.blocks[p] += 1
        self.this, self.left = np.zeros(2), BLOCK
        if self.blocks[OFF] == 0:
            self.policy = OFF
            return
        r = self.block_rate()
        best = OFF if r[OFF] > r[GATED] else GATED
        self.policy = 1 - best if int(self.blocks.sum()) % EXPLORE_BLOCKS == 0 else best


def _per_second(tokens: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """tokens / seconds elementwise, nan where no second was measured."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(seconds > 0, tokens / seconds, np.nan)


class GatedHeads:
    """The gate in the decode loop: before a step's heads are computed, ``decide`` looks up the
    longest context match of every live row's next history (``proposers.context.ContextProposer``
    keeps those searches for the step) and asks the gate; ``observe`` then credits the step's
    tokens and wall-clock seconds to the arm that ran it. A batch's first step drafts from the
    heads the prefill computes, unless the gate's policy is ``OFF`` (``prefill_heads``)."""

    def __init__(self, gate: HeadGate, context):
        self.gate, self.context = gate, context
        self.match, self.heads, self.next = 0, True, (0, True)

    def prefill_heads(self) -> bool:
        """Should a prefill that starts a batch compute the heads for its first step?"""
        return self.gate.policy != OFF

    def begin(self, index: list[int], histories: list, heads: bool) -> None:
        """A batch starts; its first step drafts from the prefill's heads if ``heads``."""
        self.match, self.heads = self._longest(index, histories), heads

    def _longest(self, index, histories) -> int:
        return min((self.context.match(i, h) for i, h in zip(index, histories)), default=0)

    def decide(self, index: list[int], histories: list) -> bool:
        """Compute heads for the step after histories ``histories`` (one per live row)?"""
        m = self._longest(index, histories)
        self.next = (m, self.gate.choose(m))
        return self.next[1]

    def observe(self, tokens: int, seconds: float) -> None:
        self.gate.update(self.match, self.heads, tokens, seconds)
        self.match, self.heads = self.next
