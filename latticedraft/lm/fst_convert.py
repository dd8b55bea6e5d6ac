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

Cost is O(N log N) in the number of n-grams (two sorts per order) and about 40 bytes per n-gram.
"""

from __future__ import annotations

import math

import numpy as np

from latticedraft.errors import InputError
from latticedraft.lm.arpa import BOS, EOS, UNK, Arpa

LN10 = math.log(10.0)

def _kernels():
    from latticedraft.lm._numba_kernels import longest_suffix, walk

    return walk, longest_suffix


def _word_index(arpa: Arpa, vocab_size: int | None) -> tuple[list[np.ndarray], int]:
    """Per order int32[n_k, k] word indices; tokens keep their code (id+1), specials go to V+1.. V+3."""
    max_code = max((int(o.words.max()) for o in arpa.orders if o.words.size), default=0)
    V = vocab_size if vocab_size is not None else max(max_code, 0)
    if max_code > V:
        k, row = _locate(arpa, lambda w: w > V)
        raise InputError(
            f"ARPA file {arpa.path}, line {arpa.orders[k].first_line + row}: token id {max_code - 1} is outside "
            f"the vocabulary of {V} ids; build the LM with the same tokenizer you query it with"
        )
    out = []
    for o in arpa.orders:
        w = o.words.copy()
        w[w == BOS] = V + 1
        w[w == EOS] = V + 2
        w[w == UNK] = V + 3
        out.append(w)
    return out, V


def _locate(arpa: Arpa, pred) -> tuple[int, int]:
    for k, o in enumerate(arpa.orders):
        bad = np.nonzero(pred(o.words).any(axis=1))[0]
        if bad.size:
            return k, int(bad[0])
    return 0, 0


def _line(arpa: Arpa, k: int, perm: np.ndarray | None, sorted_row: int) -> int:
    row = int(perm[sorted_row]) if perm is not None else sorted_row
    return arpa.orders[k].first_line + row


def arpa_arrays_to_csr(arpa: Arpa, vocab_size: int | None = None, unk_cost: float = 1000.0) -> dict:
    """Build the CSR back-off automaton of ``arpa`` (see the module docstring).

    Returns a dict of the ``NgramFst`` fields plus ``final_cost`` (float32[S], exact
    ``-ln p(</s> | state)``), ``unk_arpa_cost`` (``-ln p(<unk>)`` or nan) and ``counts``.
    """
    walk, longest_suffix = _kernels()
    words, V = _word_index(arpa, vocab_size)
    n = arpa.order
    M = V + 4
    counts = arpa.counts
    total = int(sum(counts))
    # global node arrays (level k occupies [base[k], base[k] + counts[k]))
    base = np.zeros(n + 1, dtype=np.int64)
    base[1:] = np.cumsum(counts)
    lw = np.empty(total, dtype=np.int32)  # last word of each node
    ch_lo = np.zeros(total, dtype=np.int64)
    ch_hi = np.zeros(total, dtype=np.int64)
    logprob = np.empty(total, dtype=np.float32)
    backoff = np.empty(total, dtype=np.float32)
    uni = np.full(M, -1, dtype=np.int64)
    perms: list[np.ndarray] = []
    sorted_words: list[np.ndarray] = []

    for k in range(n):  # level k holds (k+1)-grams
        W = words[k]
        o = arpa.orders[k]
        if k == 0:
            key = W[:, 0].astype(np.int64)
        else:
            prefix = np.empty(len(W), dtype=np.int64)
            walk(W, 0, k, uni, ch_lo, ch_hi, lw, prefix)
            missing = np.nonzero(prefix < 0)[0]
            if missing.size:
                r = int(missing[0])
                raise InputError(
                    f"ARPA file {arpa.path}, line {o.first_line + r}: the {k + 1}-gram's prefix "
                    f"({k}-gram) is not in the file; the ARPA must list the context of every n-gram"
                )
            key = prefix * M + W[:, k]
        perm = np.argsort(key, kind="stable")
        skey = key[perm]
        dup = np.nonzero(skey[1:] == skey[:-1])[0]
        if dup.size:
            raise InputError(
                f"ARPA file {arpa.path}, line {_line(arpa, k, perm, int(dup[0]) + 1)}: duplicate {k + 1}-gram; "
                "each n-gram may appear once"
            )
        b0, b1 = int(base[k]), int(base[k + 1])
        SW = W[perm]
        sorted_words.append(SW)
        perms.append(perm)
        lw[b0:b1] = SW[:, k]
        logprob[b0:b1] = o.logprob[perm]
        backoff[b0:b1] = o.backoff[perm]
        if k == 0:
            uni[SW[:, 0]] = np.arange(b0, b1)
        else:
            parents = skey // M  # global node ids of level k-1, non-decreasing
            pb0, pb1 = int(base[k - 1]), int(base[k])
            cnt = np.bincount(parents - pb0, minlength=pb1 - pb0)
            ends = np.cumsum(cnt) + b0
            ch_hi[pb0:pb1] = ends
            ch_lo[pb0:pb1] = ends - cnt
        del key, skey
    del words

    # longest existing proper suffix of every node (level 0: none)
    suffix = np.full(total, -1, dtype=np.int64)
    for k in range(1, n):
        b0, b1 = int(base[k]), int(base[k + 1])
        longest_suffix(sorted_words[k], k + 1, uni, ch_lo, ch_hi, lw, suffix[b0:b1])
        bad = np.nonzero(suffix[b0:b1] < 0)[0]
        if bad.size:
            r = int(bad[0])
            raise InputError(
                f"ARPA file {arpa.path}, line {_line(arpa, k, perms[k], r)}: a word of this {k + 1}-gram has no "
                "unigram entry; every word must be listed in \\1-grams:"
            )

    # states: contexts (levels 0..n-2) with an extension or a non-zero back-off, not ending in </s>
    ctx_end = int(base[n - 1])  # nodes [0, ctx_end) can be contexts
    has_ext = ch_hi[:ctx_end] > ch_lo[:ctx_end]
    is_state = (has_ext | (backoff[:ctx_end] != 0)) & (lw[:ctx_end] != V + 2)
    state_of = np.full(ctx_end, -1, dtype=np.int64)
    state_nodes = np.nonzero(is_state)[0]
    state_of[state_nodes] = np.arange(1, len(state_nodes) + 1)
    S = len(state_nodes) + 1
    # tgt[node]: the state reached after the n-gram `node` (own state or longest suffix state)
    tgt = np.zeros(total, dtype=np.int64)
    for k in range(n):
        b0, b1 = int(base[k]), int(base[k + 1])
        inherited = tgt[suffix[b0:b1]] if k > 0 else np.zeros(b1 - b0, dtype=np.int64)
        if k < n - 1:
            own = state_of[b0:b1]
            tgt[b0:b1] = np.where(own >= 0, own, inherited)
        else:
            tgt[b0:b1] = inherited

    backoff_next = np.full(S, -1, dtype=np.int32)
    backoff_cost = np.zeros(S, dtype=np.float32)
    sn_suffix = suffix[state_nodes]
    backoff_next[1:] = np.where(sn_suffix >= 0, tgt[np.maximum(sn_suffix, 0)], 0)
    backoff_cost[1:] = -LN10 * backoff[state_nodes].astype(np.float64)

    # arcs of the null state: every label 1..V
    uni_nodes = np.arange(int(base[1]))
    tok = lw[uni_nodes] <= V
    null_cost = np.full(V, unk_cost, dtype=np.float32)
    null_next = np.zeros(V, dtype=np.int32)
    null_cost[lw[uni_nodes[tok]] - 1] = -LN10 * logprob[uni_nodes[tok]].astype(np.float64)
    null_next[lw[uni_nodes[tok]] - 1] = tgt[uni_nodes[tok]]
    label_parts = [np.arange(1, V + 1, dtype=np.int32)]
    cost_parts = [null_cost]
    next_parts = [null_next]
    src_count = np.zeros(S, dtype=np.int64)
    src_count[0] = V
    final_explicit = np.full(S, np.nan, dtype=np.float64)

    for k in range(1, n):  # arcs from level k-1 states = level k nodes
        b0, b1 = int(base[k]), int(base[k + 1])
        node = np.arange(b0, b1)
        parent_state = state_of[sorted_words_parent(sorted_words[k], b0, b1, k, base, ch_lo, ch_hi)]
        w = lw[b0:b1]
        keep = (w <= V) & (parent_state >= 0)
        eos = (w == V + 2) & (parent_state >= 0)
        final_explicit[parent_state[eos]] = -LN10 * logprob[node[eos]].astype(np.float64)
        label_parts.append(w[keep].astype(np.int32))
        cost_parts.append((-LN10 * logprob[node[keep]].astype(np.float64)).astype(np.float32))
        next_parts.append(tgt[node[keep]].astype(np.int32))
        src_count += np.bincount(parent_state[keep], minlength=S)

    state_offsets = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(src_count, out=state_offsets[1:])
    arc_label = np.concatenate(label_parts)
    arc_cost = np.concatenate(cost_parts).astype(np.float32, copy=False)
    arc_next = np.concatenate(next_parts)
    del label_parts, cost_parts, next_parts

    # exact end-of-sentence cost per state (back-off resolved; states are in level order)
    eos_uni = uni[V + 2]
    final_cost = np.empty(S, dtype=np.float64)
    final_cost[0] = -LN10 * float(logprob[eos_uni]) if eos_uni >= 0 else math.inf
    for k in range(0, n - 1):
        sel = np.nonzero((state_nodes >= base[k]) & (state_nodes < base[k + 1]))[0] + 1
        fe = final_explicit[sel]
        final_cost[sel] = np.where(np.isnan(fe), backoff_cost[sel] + final_cost[backoff_next[sel]], fe)

    bos_node = uni[V + 1]
    start = int(tgt[bos_node]) if bos_node >= 0 else 0
    unk_node = uni[V + 3]
    return dict(
        order=n,
        vocab_size=V,
        state_offsets=state_offsets,
        arc_label=arc_label,
        arc_cost=arc_cost,
        arc_next=arc_next,
        backoff_next=backoff_next,
        backoff_cost=backoff_cost,
        start=start,
        unigram=0,
        final_cost=final_cost.astype(np.float32),
        unk_cost=float(unk_cost),
        unk_arpa_cost=float(-LN10 * logprob[unk_node]) if unk_node >= 0 else math.nan,
        counts=list(counts),
    )


def sorted_words_parent(SW, b0, b1, k, base, ch_lo, ch_hi) -> np.ndarray:
    """Parent node (level k-1) of each level-k node: children ranges are contiguous, so repeat."""
    pb0, pb1 = int(base[k - 1]), int(base[k])
    cnt = ch_hi[pb0:pb1] - ch_lo[pb0:pb1]
    return np.repeat(np.arange(pb0, pb1), cnt)
