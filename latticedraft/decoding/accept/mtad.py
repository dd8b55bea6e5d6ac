"""MTAD's joint acceptance rule (Qin et al., Algorithm 1 with the appendix's correction): with
P_i the target's distribution before draft token x_i (after the sampling processors) and
p_i = prod_{k <= i} P_k(x_k), q_i the draft's joint prefix probability, eta is the largest i with
min(1, p_i / q_i) > tau (0 if none); x_1..x_eta are accepted and the end token is drawn from
P_{eta+1}. Approximate: with tau >= 1 it is exactly ordinary sampling from the target.
"""

from __future__ import annotations

import numpy as np

from latticedraft.decoding.accept.sampling import SamplingOptions, SeededDraws
from latticedraft.decoding.proposers.mtad import check_mtad


class MtadRule:
    """MTAD's acceptance (corrected Algorithm 1) as an acceptance rule (``accept/rule.py``;
    approximate, not lossless). tau: the threshold."""

    lossless = False

    def __init__(self, options: SamplingOptions, tau: float = 0.1, draws=None):
        check_mtad(1, 1, tau)
        self.options, self.tau = options, float(tau)
        self.draws = draws if draws is not None else SeededDraws(options.seed)

    def eta(self, p_rows: np.ndarray, draft: np.ndarray, q: np.ndarray) -> int:
        """p_rows float64[d + 1, V] (P_1..P_{d+1}), draft int64[d], q float64[d]: the largest
        passing index (0: none)."""
        eta, p = 0, 1.0
        for i, x in enumerate(draft.tolist()):
            p *= p_rows[i, x]
            if self.tau < min(1.0, p / q[i]):
                eta = i + 1
        return eta

    def for_step(self, rows, drafts=None, qs=None, histories=None):
        etas: dict[int, int] = {}

        def ctx(r, pre):
            return np.concatenate([np.asarray(histories[r], dtype=np.int64), np.asarray(pre, dtype=np.int64)])

        def choose(batch_rows, logits, prefixes, logits_at=None):
            rep = self.options.repetition_penalty != 1.0
            p = self.options.probs(logits, [ctx(r, pre) for r, pre in zip(batch_rows, prefixes)] if rep else None)
            out, stop = [], []
            for j, (r, pre) in enumerate(zip(batch_rows, prefixes)):
                d = np.zeros(0, np.int64) if drafts is None else np.asarray(drafts[r], dtype=np.int64).reshape(-1)
                d = d[d >= 0] if len(d) else d
                if len(pre) == 0 and len(d):  # the root: decide eta from the whole chain's logits
                    pres = [tuple(d[:i].tolist()) for i in range(1, len(d))]
                    deeper = self.options.probs(logits_at([r] * len(pres), pres),
                                                [ctx(r, s) for s in pres] if rep else None) if pres else np.zeros((0, p.shape[1]))
                    etas[r] = self.eta(np.concatenate([p[j:j + 1], deeper]), d, np.asarray(qs[r]).reshape(-1))
                m = len(pre)
                if drafts is not None and m < etas.get(r, 0):
                    out.append(int(d[m]))
                    stop.append(False)
                else:  # the end token: drawn from P_{eta+1}; the step ends here even if it equals x_{eta+1}
                    out.append(self.draws.categorical(rows[r], p[j]))
                    stop.append(True)
            return np.asarray(out, dtype=np.int64), np.asarray(stop)

        choose.top_k = self.options.top_k_reads()  # the verifier may screen the rest out
        return choose
