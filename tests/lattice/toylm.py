"""A tiny back-off n-gram LM built by hand, in the ``NgramFst`` array layout, with a
pure-Python reference scorer (dicts of n-grams, back-off by recursion) to test against.

Contexts are tuples of token ids; ``BOS = -2`` stands for ``<s>``. The context set is
suffix- and prefix-closed, and a context's prefix has an arc for its last token (as in ARPA); a state's back-off is its longest proper suffix; an arc ``ctx --c-->``
leads to the longest suffix of ``ctx + (c,)`` (at most n-1 long) that is a context.
Probabilities are random and *not* normalised, and some back-off weights exceed 1, which
is exactly what exactness and admissible bounds must survive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

BOS = -2
UNSEEN = 1000.0


@dataclass
class ToyLM:
    order: int
    vocab_size: int
    contexts: list  # tuples; index = state id
    arcs: dict  # ctx -> {token: cost}
    backoff: dict  # ctx -> cost (-ln weight)
    # NgramFst fields
    state_offsets: np.ndarray = field(default=None)
    arc_label: np.ndarray = field(default=None)
    arc_cost: np.ndarray = field(default=None)
    arc_next: np.ndarray = field(default=None)
    backoff_next: np.ndarray = field(default=None)
    backoff_cost: np.ndarray = field(default=None)
    start: int = 0
    unigram: int = 0

    def __hash__(self):
        return id(self)

    # --- reference semantics (pure Python, independent of the kernels) ---
    def ref_state(self, hist: tuple) -> tuple:
        hist = tuple(hist)[-(self.order - 1):] if self.order > 1 else ()
        for j in range(len(hist) + 1):
            if hist[j:] in self.index:
                return hist[j:]
        return ()

    def ref_start(self, hist) -> tuple:
        """The context after a history, as ``NgramFst.state_for_history``: ``<s>`` first when the
        history is shorter than n-1 tokens."""
        hist = tuple(int(t) for t in hist)
        n = self.order - 1
        full = ((BOS,) + hist) if len(hist) < n else hist[len(hist) - n:]
        return self.ref_state(full)

    def ref_cost(self, ctx: tuple, c: int) -> tuple[float, tuple]:
        """(cost, next ctx) of token c after context ctx, following back-off."""
        acc = 0.0
        while True:
            if c in self.arcs[ctx]:
                nxt = self.ref_state(ctx + (c,))
                return acc + self.arcs[ctx][c], nxt
            if ctx == ():
                return acc + UNSEEN, ()
            acc += self.backoff[ctx]
            ctx = ctx[1:]

    def ref_score(self, hist, ids) -> float:
        """Total LM log-probability (natural log, float64) of ids after hist."""
        ctx = self.ref_start(hist)
        total = 0.0
        for c in ids:
            cost, ctx = self.ref_cost(ctx, int(c))
            total -= cost
        return total

    def ref_eps_score(self, hist, ids) -> float:
        """LM log-probability of ids when back-off arcs are plain epsilons (what composition +
        shortest path computes): the best over every choice of backing off, before, between
        and after the tokens."""
        frontier = {self.ref_start(hist): 0.0}
        for c in ids:
            closure = {}
            for ctx, sc in frontier.items():
                while True:
                    closure[ctx] = max(closure.get(ctx, -np.inf), sc)
                    if ctx == ():
                        break
                    sc -= self.backoff[ctx]
                    ctx = ctx[1:]
            frontier = {}
            for ctx, sc in closure.items():
                if c in self.arcs[ctx]:
                    nxt = self.ref_state(ctx + (c,))
                    frontier[nxt] = max(frontier.get(nxt, -np.inf), sc - self.arcs[ctx][c])
        # every state is final, so trailing back-off arcs count too (they gain when a
        # back-off weight exceeds 1)
        best = -np.inf
        for ctx, sc in frontier.items():
            while True:
                best = max(best, sc)
                if ctx == ():
                    break
                sc -= self.backoff[ctx]
                ctx = ctx[1:]
        return best

    # --- the NgramFst interface the rescorer uses ---
    def state_for_history(self, history) -> int:
        return self.index[self.ref_start(history)]

    def arc_lookup(self, state: int, token_id: int):
        cost, nxt = self.ref_cost(self.contexts[state], int(token_id))
        return self.index[nxt], cost

    def to_pywrapfst(self):
        import pywrapfst

        f = pywrapfst.VectorFst()
        for _ in self.contexts:
            f.add_state()
        one = pywrapfst.Weight.one(f.weight_type())
        for s, ctx in enumerate(self.contexts):
            for a in range(self.state_offsets[s], self.state_offsets[s + 1]):
                f.add_arc(s, pywrapfst.Arc(int(self.arc_label[a]), int(self.arc_label[a]),
                                           pywrapfst.Weight(f.weight_type(), float(self.arc_cost[a])),
                                           int(self.arc_next[a])))
            if self.backoff_next[s] >= 0:
                f.add_arc(s, pywrapfst.Arc(0, 0, pywrapfst.Weight(f.weight_type(), float(self.backoff_cost[s])),
                                           int(self.backoff_next[s])))
            f.set_final(s, one)
        f.set_start(self.start)
        f.arcsort("ilabel")
        return f


def make_toy_lm(V: int = 6, order: int = 3, seed: int = 0, density: float = 0.5,
                positive_backoff: bool = True, undercut: bool = True) -> ToyLM:
    """A random back-off LM over ids 0..V-1.

    ``undercut=False`` makes every higher-order arc cheaper than any back-off route to the
    same token (so the epsilon-back-off WFST cannot undercut the exact score).
    """
    rng = np.random.default_rng(seed)
    contexts = [()]
    ctx_set = {()}
    # order-1 contexts (single tokens) and <s>
    for c in [BOS] + list(range(V)):
        if c == BOS or rng.random() < 0.8:
            contexts.append((c,))
            ctx_set.add((c,))
    for n in range(2, order):
        for ctx in list(ctx_set):
            if len(ctx) != n - 1:
                continue
            for c in range(V):
                if rng.random() < density * 0.6 and (ctx[1:] + (c,)) in ctx_set:
                    new = ctx + (c,)
                    if new not in ctx_set:
                        contexts.append(new)
                        ctx_set.add(new)
    arcs, backoff = {}, {}
    for ctx in contexts:
        if ctx == ():
            costs = rng.uniform(0.5, 4.0, V)
            unseen = rng.random(V) < 0.15
            costs[unseen] = UNSEEN
            arcs[ctx] = {c: float(np.float32(costs[c])) for c in range(V)}
            continue
        # an n-gram's prefix is a context with an arc for its last token (as in any ARPA model)
        toks = sorted({c for c in range(V) if rng.random() < density}
                      | {x[-1] for x in contexts if len(x) == len(ctx) + 1 and x[:-1] == ctx})
        if undercut:
            arcs[ctx] = {c: float(np.float32(rng.uniform(0.1, 4.0))) for c in toks}
            lo, hi = (-0.7, 2.0) if positive_backoff else (0.05, 2.0)
            backoff[ctx] = float(np.float32(rng.uniform(lo, hi)))
        else:
            arcs[ctx] = {c: float(np.float32(rng.uniform(0.01, 0.4))) for c in toks}
            backoff[ctx] = float(np.float32(rng.uniform(0.5, 2.0)))
    lm = ToyLM(order, V, contexts, arcs, backoff)
    lm.index = {ctx: i for i, ctx in enumerate(contexts)}
    offs, lab, cost, nxt = [0], [], [], []
    for ctx in contexts:
        for c in sorted(arcs[ctx]):
            lab.append(c + 1)
            cost.append(arcs[ctx][c])
            nxt.append(lm.index[lm.ref_state(ctx + (c,))])
        offs.append(len(lab))
    lm.state_offsets = np.array(offs, np.int64)
    lm.arc_label = np.array(lab, np.int32)
    lm.arc_cost = np.array(cost, np.float32)
    lm.arc_next = np.array(nxt, np.int32)
    lm.backoff_next = np.array([lm.index[ctx[1:]] if ctx else -1 for ctx in contexts], np.int32)
    lm.backoff_cost = np.array([backoff.get(ctx, 0.0) for ctx in contexts], np.float32)
    lm.start = lm.index[(BOS,)]
    lm.unigram = lm.index[()]
    return lm
