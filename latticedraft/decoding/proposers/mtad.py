"""MTAD, multi-token assisted decoding (Qin et al., ``papers/mtad-multi-token-joint-decoding.txt``,
Algorithm 1 with the appendix's correction). APPROXIMATE: the output is not the target's
sampling distribution (it approximates multi-token joint decoding, which favours sequences
of high joint probability); with tau >= 1 it is exactly ordinary sampling from the target.

One step: the auxiliary draft model drafts gamma tokens by *beam sampling* (``beam_sample``:
W beams; at each position W (beam, token) pairs are drawn without replacement from the joint
q(beam prefix) * q(token | beam prefix), each conditional after the sampling processors; the
draft is the beam of highest joint q), and q_i = q(x_1..x_i | context). The target verifies
[root, x_1..x_gamma] in one call (the shared verifier, ``MtadChooser`` as its ``choose``):
with P_i the target's distribution (after the same processors) before x_i and
p_i = prod_{k <= i} P_k(x_k), eta is the largest i with min(1, p_i / q_i) > tau (0 if none):
x_1..x_eta are accepted and the end token is drawn from P_{eta+1}, the target's distribution
after them. Paper defaults: gamma = 4, W = 8, tau = 0.1, top-k 20 then top-p 0.9.

    >>> r = bpd_decode(target, [ids], MtadDrafter(draft), sampling=MTAD_SAMPLING,
    ...                chooser=MtadChooser(MTAD_SAMPLING, tau=0.1))       # doctest: +SKIP
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.proposers.heads import Drafter
from latticedraft.decoding.accept.sampling import SamplingOptions, SeededDraws
from latticedraft.errors import InputError

MTAD_SAMPLING = SamplingOptions(temperature=1.0, top_k=20, top_p=0.9)  # the paper's warping


@dataclass(frozen=True)
class MtadOptions:
    """gamma: draft tokens per step; beams: W of beam sampling; tau: the acceptance threshold."""

    gamma: int = 4
    beams: int = 8
    tau: float = 0.1

    def __post_init__(self):
        check_mtad(self.gamma, self.beams, self.tau)


def check_mtad(gamma: int, beams: int, tau: float) -> None:
    if gamma < 1:
        raise InputError(f"--gamma {gamma}: MTAD drafts at least 1 token per step")
    if beams < 1:
        raise InputError(f"--beams {beams}: beam sampling needs at least 1 beam")
    if not (np.isfinite(tau) and tau >= 0):
        raise InputError(f"--tau {tau} must be a number >= 0 (>= 1: ordinary sampling from the target)")


@torch.inference_mode()
def beam_sample(draft_model, history: np.ndarray, gamma: int, beams: int, options: SamplingOptions,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Beam sampling with ``draft_model`` after ``history`` (int64[t]). Returns the draft
    int64[gamma] (the beam of highest joint q) and q float64[gamma], q[i] = q(x_1..x_{i+1} |
    history), the product of the processed conditionals. Costs gamma forwards of [W, t + i]."""
    dev = next(draft_model.parameters()).device
    seqs = np.zeros((1, 0), dtype=np.int64)
    logq = np.zeros(1)
    cum = np.zeros((1, 0))  # joint log q of every prefix of every beam
    for _ in range(gamma):
        ids = np.concatenate([np.repeat(history[None], len(seqs), axis=0), seqs], axis=1)
        logits = draft_model(input_ids=torch.as_tensor(ids, device=dev)).logits[:, -1]
        ctx = list(ids) if options.repetition_penalty != 1.0 else None
        cond = options.probs(logits, ctx)  # [w, V]
        with np.errstate(divide="ignore"):
            joint = logq[:, None] + np.log(cond)  # [w, V]
        flat = np.exp(joint - joint.max()).reshape(-1)
        n = min(beams, int((flat > 0).sum()))
        pick = rng.choice(len(flat), size=n, replace=False, p=flat / flat.sum())
        b, tok = np.divmod(pick, cond.shape[1])
        logq = joint[b, tok]
        seqs = np.concatenate([seqs[b], tok[:, None]], axis=1)
        cum = np.concatenate([cum[b], logq[:, None]], axis=1)
    best = int(np.argmax(logq))
    return seqs[best].astype(np.int64), np.exp(cum[best])


class MtadDrafter(Drafter):
    """MTAD's drafter: ``beam_sample`` with an auxiliary causal LM (the target's vocabulary).
    ``sample`` returns (int64[1, d], q float64[1, d]: joint prefix probabilities, what
    ``MtadChooser`` reads). Beam sampling draws from its own generator per row,
    ``default_rng([seed, row, 1])``, so the verification's draws do not depend on it."""

    name = "mtad"
    uses_heads = False

    def __init__(self, draft_model, gamma: int = 4, beams: int = 8):
        super().__init__(None)
        check_mtad(gamma, beams, 0.0)
        self.draft_model, self.gamma, self.beams = draft_model, int(gamma), int(beams)
        self.rng = None

    def spawn(self, row: int = 0):
        d = copy.copy(self)
        d.rng = None
        return d

    def draft(self, sausage, history):
        raise InputError("MTAD samples; it has no greedy drafts (use --drafter model for greedy speculative decoding)")

    def sample(self, head_logits, vocab, history, sampler, room):
        n = min(self.gamma, room)
        if n == 0:
            return np.zeros((1, 0), np.int64), np.zeros((1, 0))
        if self.rng is None:
            self.rng = np.random.default_rng([sampler.options.seed, sampler.row, 1])
        toks, q = beam_sample(self.draft_model, np.asarray(history, dtype=np.int64), n, self.beams,
                              sampler.options, self.rng)
        return toks[None], q[None]


class MtadChooser:
    """The verifier's ``choose`` for MTAD's acceptance (corrected Algorithm 1); same
    ``for_step`` convention as ``spec_sampling.SpeculativeChooser``. tau: the threshold."""

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

        return choose
