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


def arpa_arrays_to_csr(arpa: Arpa, vocab_size: int | None = None, unk_cost: float = 1000.0,
                       consume: bool = False) -> dict:
    """Build the CSR back-off automaton of ``arpa`` (see the module docstring).

    ``consume=True`` frees the ARPA's arrays level by level (lower peak memory).
    Returns a dict of the ``NgramFst`` fields plus ``final_cost`` (float32[S], exact
    ``-ln p(</s> | state)``), ``unk_arpa_cost`` (``-ln p(<unk>)`` or nan) and ``counts``.
    """
    walk, longest_suffix = _kernels()
    V = _vocab_size(arpa, vocab_size)
    n = arpa.order
    M = V + 4
    BOSW, EOSW, UNKW = V + 1, V + 2, V + 3
    counts = arpa.counts
    base = [0]
    for c in counts:
        base.append(base[-1] + c)
    total, nctx = base[n], base[n - 1]
    if total >= 2**31 - 1:
        raise InputError(f"ARPA file {arpa.path} has {total} n-grams; at most 2^31 are supported")
    lw = np.empty(total, dtype=np.int32)  # last word of each node (levels in sorted order)
    lp = np.empty(total, dtype=np.float32)  # log10 p
    bo = np.zeros(nctx, dtype=np.float32)  # log10 back-off (contexts only)
    ch_lo = np.zeros(nctx, dtype=np.int32)  # children of context node: [ch_lo, ch_hi) on the next level
    ch_hi = np.zeros(nctx, dtype=np.int32)
    uni = np.full(M, -1, dtype=np.int32)
    tgt = np.zeros(total, dtype=np.int32)  # state reached after the n-gram (own or longest-suffix state)
    state_of = np.full(nctx, -1, dtype=np.int32)
    bo_next_parts, bo_cost_parts, level_states = [np.array([-1], np.int32)], [np.zeros(1, np.float32)], [(0, 1)]
    n_states = 1
    suf_prev = None

    def finalize_level(j: int, suf: np.ndarray | None) -> None:
        """Level j is complete (its children are known): choose its states, fill tgt, back-offs."""
        nonlocal n_states
        b0, b1 = base[j], base[j + 1]
        inherited = tgt[suf] if suf is not None else np.zeros(b1 - b0, dtype=np.int32)
        if j == n - 1:
            tgt[b0:b1] = inherited
            return
        is_state = ((ch_hi[b0:b1] > ch_lo[b0:b1]) | (bo[b0:b1] != 0)) & (lw[b0:b1] != EOSW)
        m = int(is_state.sum())
        own = np.full(b1 - b0, -1, dtype=np.int32)
        own[is_state] = np.arange(n_states, n_states + m, dtype=np.int32)
        state_of[b0:b1] = own
        tgt[b0:b1] = np.where(is_state, own, inherited)
        bo_next_parts.append(inherited[is_state])
        bo_cost_parts.append(_neg_ln(bo[b0:b1][is_state]))
        level_states.append((n_states, n_states + m))
        n_states += m

    for k in range(n):  # level k holds the (k+1)-grams
        o = arpa.orders[k]
        W = o.words if consume else o.words.copy()
        W[W == BOS] = BOSW
        W[W == EOS] = EOSW
        W[W == UNK] = UNKW
        b0, b1 = base[k], base[k + 1]
        if k == 0:
            key = W[:, 0].astype(np.int64)
        else:
            prefix = np.empty(b1 - b0, dtype=np.int32)
            walk(W, 0, k, uni, ch_lo, ch_hi, lw, prefix)
            missing = np.flatnonzero(prefix < 0)
            if missing.size:
                raise InputError(
                    f"ARPA file {arpa.path}, line {o.first_line + int(missing[0])}: the {k + 1}-gram's prefix "
                    f"({k}-gram) is not in the file; the ARPA must list the context of every n-gram"
                )
            key = prefix.astype(np.int64)
            del prefix
            key *= M
            key += W[:, k]
        perm = np.argsort(key)
        key = key[perm]
        dup = np.flatnonzero(key[1:] == key[:-1])
        if dup.size:
            raise InputError(
                f"ARPA file {arpa.path}, line {_line(arpa, k, perm, int(dup[0]) + 1)}: duplicate {k + 1}-gram; "
                "each n-gram may appear once"
            )
        lw[b0:b1] = W[perm, k]
        lp[b0:b1] = o.logprob[perm]
        if k < n - 1:
            bo[b0:b1] = o.backoff[perm]
        if k == 0:
            uni[lw[b0:b1]] = np.arange(b0, b1, dtype=np.int32)
        else:
            key //= M  # parent node ids, non-decreasing
            cnt = np.bincount(key - base[k - 1], minlength=base[k] - base[k - 1])
            np.cumsum(cnt, out=cnt)
            ch_hi[base[k - 1]:base[k]] = cnt + b0
            ch_lo[base[k - 1] + 1:base[k]] = ch_hi[base[k - 1]:base[k] - 1]
            ch_lo[base[k - 1]] = b0
            del cnt
        del key
        suf = None
        if k > 0:
            suf = np.empty(b1 - b0, dtype=np.int32)
            longest_suffix(W, k + 1, uni, ch_lo, ch_hi, lw, suf)
            bad = np.flatnonzero(suf < 0)
            if bad.size:
                raise InputError(
                    f"ARPA file {arpa.path}, line {o.first_line + int(bad[0])}: a word of this {k + 1}-gram has no "
                    "unigram entry; every word must be listed in \\1-grams:"
                )
            suf = suf[perm]
        del perm, W
        if consume:
            o.words = o.logprob = o.backoff = None
        if k >= 1:
            finalize_level(k - 1, suf_prev)
        suf_prev = suf
    finalize_level(n - 1, suf_prev)
    del suf_prev
    S = n_states
    backoff_next = np.concatenate(bo_next_parts)
    backoff_cost = np.concatenate(bo_cost_parts)
    del bo, bo_next_parts, bo_cost_parts

    # arcs: null state (all V labels), then the children of each level's states, in state order
    def parent_state(k: int) -> np.ndarray:
        pb0, pb1 = base[k - 1], base[k]
        return np.repeat(state_of[pb0:pb1], ch_hi[pb0:pb1] - ch_lo[pb0:pb1])

    n_arcs = V
    for k in range(1, n):
        n_arcs += int(np.count_nonzero((lw[base[k]:base[k + 1]] <= V) & (parent_state(k) >= 0)))
    arc_label = np.empty(n_arcs, dtype=np.int32)
    arc_cost = np.empty(n_arcs, dtype=np.float32)
    arc_next = np.empty(n_arcs, dtype=np.int32)
    arc_label[:V] = np.arange(1, V + 1, dtype=np.int32)
    arc_cost[:V] = unk_cost
    arc_next[:V] = 0
    u = np.arange(base[1])
    u = u[lw[u] <= V]
    arc_cost[lw[u] - 1] = _neg_ln(lp[u])
    arc_next[lw[u] - 1] = tgt[u]
    src_count = np.zeros(S, dtype=np.int64)
    src_count[0] = V
    final_explicit = np.full(S, np.nan, dtype=np.float32)
    pos = V
    for k in range(1, n):
        b0, b1 = base[k], base[k + 1]
        ps = parent_state(k)
        w = lw[b0:b1]
        keep = (w <= V) & (ps >= 0)
        m = int(np.count_nonzero(keep))
        arc_label[pos:pos + m] = w[keep]
        arc_cost[pos:pos + m] = _neg_ln(lp[b0:b1][keep])
        arc_next[pos:pos + m] = tgt[b0:b1][keep]
        pos += m
        src_count += np.bincount(ps[keep], minlength=S)
        eos = (w == EOSW) & (ps >= 0)
        final_explicit[ps[eos]] = _neg_ln(lp[b0:b1][eos])
        del ps, keep, eos, w
    state_offsets = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(src_count, out=state_offsets[1:])

    # exact end-of-sentence cost per state (back-off resolved; back-off targets are on lower levels)
    final_cost = np.empty(S, dtype=np.float32)
    eos_uni = uni[EOSW]
    final_cost[0] = _neg_ln(lp[eos_uni]) if eos_uni >= 0 else np.inf
    for s0, s1 in level_states[1:]:
        fe = final_explicit[s0:s1]
        final_cost[s0:s1] = np.where(np.isnan(fe), backoff_cost[s0:s1] + final_cost[backoff_next[s0:s1]], fe)

    bos_node, unk_node = uni[BOSW], uni[UNKW]
    return dict(
        order=n,
        vocab_size=V,
        state_offsets=state_offsets,
        arc_label=arc_label,
        arc_cost=arc_cost,
        arc_next=arc_next,
        backoff_next=backoff_next,
        backoff_cost=backoff_cost,
        start=int(tgt[bos_node]) if bos_node >= 0 else 0,
        unigram=0,
        final_cost=final_cost,
        unk_cost=float(unk_cost),
        unk_arpa_cost=float(_neg_ln(lp[unk_node])) if unk_node >= 0 else math.nan,
        counts=list(counts),
    )
