"""MTAD, multi-token assisted decoding (Qin et al., ``papers/mtad-multi-token-joint-decoding.txt``,
Algorithm 1 with the appendix's correction). APPROXIMATE: the output is not the target's
sampling distribution (it approximates multi-token joint decoding, which favours sequences
of high joint probability); with tau >= 1 it is exactly ordinary sampling from the target.

One step: the auxiliary draft model drafts gamma tokens by *beam sampling* (``beam_sample``:
W beams; at each position W (beam, token) pairs are drawn without replacement from the joint
q(beam prefix) * q(token | beam prefix) (Gumbel-top-k over the pairs the processors keep), each
conditional after the sampling processors; the draft is the beam of highest joint q), and
q_i = q(x_1..x_i | context). The target verifies [root, x_1..x_gamma] in one call on the one
loop, accepting by ``accept.mtad.MtadRule``: with P_i the target's distribution (after the same
processors) before x_i and p_i = prod_{k <= i} P_k(x_k), eta is the largest i with
min(1, p_i / q_i) > tau (0 if none): x_1..x_eta are accepted and the end token is drawn from
P_{eta+1}, the target's distribution after them.
Paper defaults: gamma = 4, W = 8, tau = 0.1, top-k 20 then top-p 0.9.

``MtadProposer`` is the draft source; ``methods/mtad.py`` decodes with it and ``accept.mtad.MtadRule``.

    >>> r = speculative_decode(target, [ids], [MtadProposer(draft)], Request(sampling=MTAD_SAMPLING),
    ...                        rule=MtadRule(MTAD_SAMPLING, tau=0.1))       # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.decoding.proposers.base import EMPTY, Proposal, Proposer, Step, StepRows
from latticedraft.decoding.accept.sampling import SamplingOptions
from latticedraft.errors import InputError
from latticedraft.gpu.verify.incremental import IncrementalLM, lean_stack

MTAD_SAMPLING = SamplingOptions(temperature=1.0, top_k=20, top_p=0.9)  # the paper's warping


def check_mtad(gamma: int, beams: int, tau: float) -> None:
    if gamma < 1:
        raise InputError(f"--gamma {gamma}: MTAD drafts at least 1 token per step")
    if beams < 1:
        raise InputError(f"--beams {beams}: beam sampling needs at least 1 beam")
    if not (np.isfinite(tau) and tau >= 0):
        raise InputError(f"--tau {tau} must be a number >= 0 (>= 1: ordinary sampling from the target)")


@torch.inference_mode()
def beam_sample(draft_model, history: np.ndarray, gamma: int, beams: int, options: SamplingOptions,
                rng: np.random.Generator, lm: IncrementalLM | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Beam sampling with ``draft_model`` after ``history`` (int64[t]). Returns the draft
    int64[gamma] (the beam of highest joint q) and q float64[gamma], q[i] = q(x_1..x_{i+1} |
    history), the product of the processed conditionals.

    The history runs through ``lm`` (an ``IncrementalLM`` of the draft model that keeps its cache
    between steps: only the tokens accepted since the last step are fed; default a fresh one);
    then every draft position is one call over the W beams' newest tokens (``lm.beams()``: their
    caches copied from the history's and reordered as beams are kept): gamma - 1 calls of W
    tokens per step."""
    lm = lm if lm is not None else IncrementalLM(draft_model)
    logits = lm.next_logits(np.asarray(history, dtype=np.int64), room=gamma)[None]  # [1, V]
    fork = lm.beams()
    seqs = np.zeros((1, 0), dtype=np.int64)
    logq = np.zeros(1)
    cum = np.zeros((1, 0))  # joint log q of every prefix of every beam
    for j in range(gamma):
        if j:
            logits = fork.step(seqs[:, -1])
        ctx = None
        if options.repetition_penalty != 1.0:
            ctx = [np.concatenate([history, s]) for s in seqs]
        b, tok, cond = options.kept(logits, ctx)  # the (beam, token) pairs the processors keep
        joint = logq[b] + np.log(cond)
        n = min(beams, len(joint))
        # n draws without replacement, each proportional to exp(joint) among those left: the n
        # largest joint + Gumbel(0, 1) keys (the Gumbel-top-k trick), best first
        keys = joint + rng.gumbel(size=len(joint))
        pick = np.argpartition(-keys, n - 1)[:n] if n < len(keys) else np.arange(n)
        pick = pick[np.argsort(-keys[pick], kind="stable")]
        b, tok, logq = b[pick], tok[pick], joint[pick]
        seqs = np.concatenate([seqs[b], tok[:, None]], axis=1)
        cum = np.concatenate([cum[b], logq[:, None]], axis=1)
        if j + 1 < gamma:
            fork.keep(b)
    best = int(np.argmax(logq))
    return seqs[best].astype(np.int64), np.exp(cum[best])


class MtadProposer(Proposer):
    """MTAD's draft source: ``beam_sample`` with an auxiliary causal LM (the target's vocabulary).
    Each row's proposal is one path int64[1, d] with q float64[1, d]: the joint prefix
    probabilities ``accept.mtad.MtadRule`` reads. Beam sampling draws from its own generator per
    row, ``default_rng([seed, row, 1])``, so the verification's draws do not depend on it."""

    name = "mtad"

    def __init__(self, draft_model, gamma: int = 4, beams: int = 8):
        check_mtad(gamma, beams, 0.0)
        self.draft_model, self.gamma, self.beams = draft_model, int(gamma), int(beams)
        self.rngs: dict[int, np.random.Generator] = {}
        self.lms: dict[int, IncrementalLM] = {}

    def start(self, rows: StepRows) -> None:
        self.rngs = {}
        stack = lean_stack(self.draft_model)
        self.lms = {i: IncrementalLM(self.draft_model, stack) for i in rows.index}

    def propose(self, step: Step) -> list[Proposal]:
        if step.samplers is None:
            raise InputError("MTAD samples; it has no greedy drafts (use --drafter model for greedy speculative decoding)")
        out = []
        for j, i in enumerate(step.index):
            n, sampler = min(self.gamma, step.rooms[j]), step.samplers[j]
            if n == 0:
                out.append(Proposal(EMPTY, q=np.zeros((1, 0))))
                continue
            rng = self.rngs.setdefault(i, np.random.default_rng([sampler.options.seed, sampler.row, 1]))
            toks, q = beam_sample(self.draft_model, np.asarray(step.histories[j], dtype=np.int64), n, self.beams,
                                  sampler.options, rng, self.lms[i])
            out.append(Proposal(toks[None], q=q[None]))
        return out
