"""ARPA arrays → back-off WFST arrays (CSR), vectorised with numpy and a small numba trie walk.

Construction (``n`` = order, word index ``w``: token id + 1 for tokens, ``V+1..V+3`` for
``<s> </s> <unk>``):

1. The n-grams of each order are sorted by ``(prefix node, last word)``; this makes them a
   trie level: the children of a k-gram node are one contiguous, word-sorted range of level k+1.
   Prefixes are found by walking the levels already built (binary search in child ranges).
2. Every k-gram (k < n) that has an extension or a non-zero back-off becomes a *state*; one
   without either is equivalent to its longest suffix state and is folded into it (KenLM's
   right-state minimisation), so the FST has no useless states.
3. Arcs: the null-context state 0 has one arc per label 1..V (unigram cost, ``unk_cost`` for
   ids absent from the ARPA); a state for context ``c`` has one arc per explicit n-gram ``c x``
   (x a token), ending in the state of the longest suffix of ``c x`` that is a state.
   ``c </s>`` gives the state's end-of-sentence cost; n-grams ending in ``<unk>`` have no label.
4. Because states are numbered level by level in sorted order, arcs come out grouped by source
   state and label-sorted without a global sort.

Cost: O(N log N) in the number of n-grams (one argsort per order) plus O(N * order) trie
walks in numba; the input is consumed level by level, so the peak is about twice the written
``lm.fst`` (``benchmarks/lm_build.py`` measures both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from latticedraft.errors import InputError
from latticedraft.lm.arpa import BOS, EOS, UNK, Arpa

LN10 = math.log(10.0)


def _kernels():
    """numba kernels, imported on first use (querying a built LM never loads numba)."""
    from latticedraft.lm._numba_kernels import longest_suffix, walk

    return walk, longest_suffix


def _vocab_size(arpa: Arpa, vocab_size: int | None) -> int:
    """V: the given vocabulary size (checked against the file's largest id) or largest id + 1."""
    max_code = max((int(o.words.max()) for o in arpa.orders if o.words.size), default=0)
    V = vocab_size if vocab_size is not None else max(max_code, 1)
    if max_code > V:
        k, row = _locate(arpa, lambda w: w > V)
        bad_id = int(arpa.orders[k].words[row].max()) - 1
        raise InputError(
            f"ARPA file {arpa.path}, line {arpa.orders[k].first_line + row}: token id {bad_id} is outside "
            f"the vocabulary of {V} ids; build the LM with the same tokenizer you query it with"
        )
    return V


def _locate(arpa: Arpa, pred) -> tuple[int, int]:
    for k, o in enumerate(arpa.orders):
        bad = np.nonzero(pred(o.words).any(axis=1))[0]
        if bad.size:
            return k, int(bad[0])
    return 0, 0


def _line(arpa: Arpa, k: int, perm: np.ndarray | None, sorted_row: int) -> int:
    row = int(perm[sorted_row]) if perm is not None else sorted_row
    return arpa.orders[k].first_line + row


def _neg_ln(log10: np.ndarray) -> np.ndarray:
    """float32 tropical cost ``-ln(10) * log10`` (float32 arithmetic, as KenLM stores float32)."""
    return np.multiply(log10, np.float32(-LN10), dtype=np.float32)


@dataclass
class _Trie:
    """The n-gram trie of an ARPA, built level by level, and the states chosen so far.

    Level k holds the (k+1)-grams, nodes ``base[k]..base[k+1]`` in ``(prefix node, last word)``
    order. Per node: ``lw`` last word, ``lp`` log10 p, ``tgt`` the state reached after it. Per
    context node (levels below n-1): ``bo`` log10 back-off, children ``[ch_lo, ch_hi)`` on the next
    level, ``state_of`` its own state or -1. ``uni``: word -> unigram node (-1: none). The states'
    back-off targets and costs are gathered per level in ``bo_next`` / ``bo_cost``, their id
    ranges in ``level_states``."""

    arpa: Arpa
    V: int
    base: list[int]
    lw: np.ndarray
    lp: np.ndarray
    bo: np.ndarray | None
    ch_lo: np.ndarray
    ch_hi: np.ndarray
    uni: np.ndarray
    tgt: np.ndarray
    state_of: np.ndarray
    bo_next: list = field(default_factory=lambda: [np.array([-1], np.int32)])
    bo_cost: list = field(default_factory=lambda: [np.zeros(1, np.float32)])
    level_states: list = field(default_factory=lambda: [(0, 1)])
    n_states: int = 1

    @property
    def n(self) -> int:
        return self.arpa.order

    @property
    def M(self) -> int:
        """The word-index range (V + 4): the sort key's radix."""
        return self.V + 4


def _new_trie(arpa: Arpa, V: int) -> _Trie:
    """The empty trie of ``arpa``'s n-gram counts (refused beyond 2^31 n-grams)."""
    base = [0]
    for c in arpa.counts:
        base.append(base[-1] + c)
    n = arpa.order
    total, nctx = base[n], base[n - 1]
    if total >= 2**31 - 1:
        raise InputError(f"ARPA file {arpa.path} has {total} n-grams; at most 2^31 are supported")
    return _Trie(arpa=arpa, V=V, base=base, lw=np.empty(total, dtype=np.int32), lp=np.empty(total, dtype=np.float32),
                 bo=np.zeros(nctx, dtype=np.float32), ch_lo=np.zeros(nctx, dtype=np.int32),
                 ch_hi=np.zeros(nctx, dtype=np.int32), uni=np.full(V + 4, -1, dtype=np.int32),
                 tgt=np.zeros(total, dtype=np.int32), state_of=np.full(nctx, -1, dtype=np.int32))


def _level_words(t: _Trie, k: int, consume: bool) -> np.ndarray:
    """Level k's n-grams in file order as word indices ``[N_k, k+1]`` (``<s> </s> <unk>`` -> V+1..V+3);
    ``consume``: in place, in the ARPA's own array."""
    o = t.arpa.orders[k]
    W = o.words if consume else o.words.copy()
    W[W == BOS] = t.V + 1
    W[W == EOS] = t.V + 2
    W[W == UNK] = t.V + 3
    return W


def _level_keys(t: _Trie, k: int, W: np.ndarray) -> np.ndarray:
    """int64 sort key of each (k+1)-gram of ``W``: ``prefix node * M + last word`` (the word alone at
    k = 0). Refuses an n-gram whose prefix is not in the file."""
    if k == 0:
        return W[:, 0].astype(np.int64)
    walk, _ = _kernels()
    o = t.arpa.orders[k]
    prefix = np.empty(t.base[k + 1] - t.base[k], dtype=np.int32)
    walk(W, 0, k, t.uni, t.ch_lo, t.ch_hi, t.lw, prefix)
    missing = np.flatnonzero(prefix < 0)
    if missing.size:
        raise InputError(
            f"ARPA file {t.arpa.path}, line {o.first_line + int(missing[0])}: the {k + 1}-gram's prefix "
            f"({k}-gram) is not in the file; the ARPA must list the context of every n-gram"
        )
    key = prefix.astype(np.int64)
    del prefix
    key *= t.M
    key += W[:, k]
    return key


def _link_children(t: _Trie, k: int, parents: np.ndarray) -> None:
    """Set the child ranges of level k-1 from ``parents``: the parent node of each level-k node, in
    node order (non-decreasing)."""
    p0, p1, b0 = t.base[k - 1], t.base[k], t.base[k]
    cnt = np.bincount(parents - p0, minlength=p1 - p0)
    np.cumsum(cnt, out=cnt)
    t.ch_hi[p0:p1] = cnt + b0
    t.ch_lo[p0 + 1:p1] = t.ch_hi[p0:p1 - 1]
    t.ch_lo[p0] = b0


def _suffixes(t: _Trie, k: int, W: np.ndarray) -> np.ndarray:
    """The longest proper suffix node of each (k+1)-gram of ``W`` (k >= 1), in file order; refuses a
    word without a unigram entry."""
    _, longest_suffix = _kernels()
    suf = np.empty(t.base[k + 1] - t.base[k], dtype=np.int32)
    longest_suffix(W, k + 1, t.uni, t.ch_lo, t.ch_hi, t.lw, suf)
    bad = np.flatnonzero(suf < 0)
    if bad.size:
        raise InputError(
            f"ARPA file {t.arpa.path}, line {t.arpa.orders[k].first_line + int(bad[0])}: a word of this {k + 1}-gram "
            "has no unigram entry; every word must be listed in \\1-grams:"
        )
    return suf


def _add_level(t: _Trie, k: int, consume: bool) -> np.ndarray | None:
    """Sort level k into the trie (last words, log-probs, back-offs, the child ranges of level k-1);
    returns its nodes' longest proper suffix nodes in node order (None at level 0). ``consume``
    frees the ARPA's arrays of this level."""
    o = t.arpa.orders[k]
    W = _level_words(t, k, consume)
    key = _level_keys(t, k, W)
    perm = np.argsort(key)
    key = key[perm]
    dup = np.flatnonzero(key[1:] == key[:-1])
    if dup.size:
        raise InputError(
            f"ARPA file {t.arpa.path}, line {_line(t.arpa, k, perm, int(dup[0]) + 1)}: duplicate {k + 1}-gram; "
            "each n-gram may appear once"
        )
    b0, b1 = t.base[k], t.base[k + 1]
    t.lw[b0:b1] = W[perm, k]
    t.lp[b0:b1] = o.logprob[perm]
    if k < t.n - 1:
        t.bo[b0:b1] = o.backoff[perm]
    if k == 0:
        t.uni[t.lw[b0:b1]] = np.arange(b0, b1, dtype=np.int32)
    else:
        key //= t.M  # parent node ids, non-decreasing
        _link_children(t, k, key)
    del key
    suf = _suffixes(t, k, W)[perm] if k > 0 else None
    del perm, W
    if consume:
        o.words = o.logprob = o.backoff = None
    return suf


def _finalize_level(t: _Trie, j: int, suf: np.ndarray | None) -> None:
    """Level j is complete (its children are known): choose its states, fill ``tgt`` and the back-offs.
    ``suf``: its nodes' longest proper suffix nodes (None at level 0)."""
    b0, b1 = t.base[j], t.base[j + 1]
    inherited = t.tgt[suf] if suf is not None else np.zeros(b1 - b0, dtype=np.int32)
    if j == t.n - 1:
        t.tgt[b0:b1] = inherited
        return
    is_state = ((t.ch_hi[b0:b1] > t.ch_lo[b0:b1]) | (t.bo[b0:b1] != 0)) & (t.lw[b0:b1] != t.V + 2)
    m = int(is_state.sum())
    own = np.full(b1 - b0, -1, dtype=np.int32)
    own[is_state] = np.arange(t.n_states, t.n_states + m, dtype=np.int32)
    t.state_of[b0:b1] = own
    t.tgt[b0:b1] = np.where(is_state, own, inherited)
    t.bo_next.append(inherited[is_state])
    t.bo_cost.append(_neg_ln(t.bo[b0:b1][is_state]))
    t.level_states.append((t.n_states, t.n_states + m))
    t.n_states += m


def _build_trie(arpa: Arpa, V: int, consume: bool) -> _Trie:
    """Steps 1 and 2 of the module docstring: the trie, level by level, and its states (each level
    is finalised once the next one has given it its children)."""
    t = _new_trie(arpa, V)
    suf_prev = None
    for k in range(t.n):
        suf = _add_level(t, k, consume)
        if k >= 1:
            _finalize_level(t, k - 1, suf_prev)
        suf_prev = suf
    _finalize_level(t, t.n - 1, suf_prev)
    return t


def _parent_states(t: _Trie, k: int) -> np.ndarray:
    """The state of each level-k node's parent (-1 where the parent is no state), in node order."""
    pb0, pb1 = t.base[k - 1], t.base[k]
    return np.repeat(t.state_of[pb0:pb1], t.ch_hi[pb0:pb1] - t.ch_lo[pb0:pb1])


@dataclass
class _Arcs:
    """The CSR arcs (grouped by source state, label-sorted) and each state's explicit
    ``-ln p(</s> | state)`` (nan where the ARPA lists none)."""

    state_offsets: np.ndarray
    label: np.ndarray
    cost: np.ndarray
    next: np.ndarray
    final_explicit: np.ndarray


def _null_arcs(t: _Trie, n_arcs: int, unk_cost: float) -> _Arcs:
    """Arc arrays for ``n_arcs`` arcs with the null-context state's V filled: one per label, the
    unigram cost (``unk_cost`` for ids absent from the ARPA)."""
    V, S = t.V, t.n_states
    a = _Arcs(state_offsets=np.zeros(S + 1, dtype=np.int64), label=np.empty(n_arcs, dtype=np.int32),
              cost=np.empty(n_arcs, dtype=np.float32), next=np.empty(n_arcs, dtype=np.int32),
              final_explicit=np.full(S, np.nan, dtype=np.float32))
    a.label[:V] = np.arange(1, V + 1, dtype=np.int32)
    a.cost[:V] = unk_cost
    a.next[:V] = 0
    u = np.arange(t.base[1])
    u = u[t.lw[u] <= V]
    a.cost[t.lw[u] - 1] = _neg_ln(t.lp[u])
    a.next[t.lw[u] - 1] = t.tgt[u]
    return a


def _arcs(t: _Trie, unk_cost: float) -> _Arcs:
    """Step 3: the null state's V arcs, then each level's explicit n-grams under their parent's state,
    in state order (step 4); ``c </s>`` gives the state's end-of-sentence cost instead of an arc."""
    V, S, base, lw = t.V, t.n_states, t.base, t.lw
    n_arcs = V
    for k in range(1, t.n):
        n_arcs += int(np.count_nonzero((lw[base[k]:base[k + 1]] <= V) & (_parent_states(t, k) >= 0)))
    a = _null_arcs(t, n_arcs, unk_cost)
    src_count = np.zeros(S, dtype=np.int64)
    src_count[0] = V
    pos = V
    for k in range(1, t.n):
        b0, b1 = base[k], base[k + 1]
        ps = _parent_states(t, k)
        w = lw[b0:b1]
        keep = (w <= V) & (ps >= 0)
        m = int(np.count_nonzero(keep))
        a.label[pos:pos + m] = w[keep]
        a.cost[pos:pos + m] = _neg_ln(t.lp[b0:b1][keep])
        a.next[pos:pos + m] = t.tgt[b0:b1][keep]
        pos += m
        src_count += np.bincount(ps[keep], minlength=S)
        eos = (w == V + 2) & (ps >= 0)
        a.final_explicit[ps[eos]] = _neg_ln(t.lp[b0:b1][eos])
        del ps, keep, eos, w
    np.cumsum(src_count, out=a.state_offsets[1:])
    return a


def _final_costs(t: _Trie, final_explicit: np.ndarray, backoff_next: np.ndarray,
                 backoff_cost: np.ndarray) -> np.ndarray:
    """Exact ``-ln p(</s> | state)`` per state: the explicit cost, else back-off resolved level by
    level (back-off targets are on lower levels)."""
    final_cost = np.empty(t.n_states, dtype=np.float32)
    eos_uni = t.uni[t.V + 2]
    final_cost[0] = _neg_ln(t.lp[eos_uni]) if eos_uni >= 0 else np.inf
    for s0, s1 in t.level_states[1:]:
        fe = final_explicit[s0:s1]
        final_cost[s0:s1] = np.where(np.isnan(fe), backoff_cost[s0:s1] + final_cost[backoff_next[s0:s1]], fe)
    return final_cost


def arpa_arrays_to_csr(arpa: Arpa, vocab_size: int | None = None, unk_cost: float = 1000.0,
                       consume: bool = False) -> dict:
    """Build the CSR back-off automaton of ``arpa`` (see the module docstring).

    ``consume=True`` frees the ARPA's arrays level by level (lower peak memory).
    Returns a dict of the ``NgramFst`` fields plus ``final_cost`` (float32[S], exact
    ``-ln p(</s> | state)``), ``unk_arpa_cost`` (``-ln p(<unk>)`` or nan) and ``counts``.
    """
    counts = arpa.counts
    t = _build_trie(arpa, _vocab_size(arpa, vocab_size), consume)
    backoff_next, backoff_cost = np.concatenate(t.bo_next), np.concatenate(t.bo_cost)
    t.bo = t.bo_next = t.bo_cost = None
    arcs = _arcs(t, unk_cost)
    final_cost = _final_costs(t, arcs.final_explicit, backoff_next, backoff_cost)
    bos_node, unk_node = t.uni[t.V + 1], t.uni[t.V + 3]
    return dict(
        order=t.n,
        vocab_size=t.V,
        state_offsets=arcs.state_offsets,
        arc_label=arcs.label,
        arc_cost=arcs.cost,
        arc_next=arcs.next,
        backoff_next=backoff_next,
        backoff_cost=backoff_cost,
        start=int(t.tgt[bos_node]) if bos_node >= 0 else 0,
        unigram=0,
        final_cost=final_cost,
        unk_cost=float(unk_cost),
        unk_arpa_cost=float(_neg_ln(t.lp[unk_node])) if unk_node >= 0 else math.nan,
        counts=list(counts),
    )
