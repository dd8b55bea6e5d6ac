"""Drafts from the heads: one step's sausage lattice -> the paths the target verifies.

``HeadProposer`` wraps one lattice drafter per row (``Drafter.spawn``)::

    class Drafter:
        lattice(head_logits [h-1, V']) -> Sausage         # top-k + pruning (LatticeOptions)
        draft(sausage, history: int64[t]) -> Drafts       # tokens int64[p, d], scores float32[p]
        spawn(row: int) -> Drafter                        # per-sequence copy (own state)

The sausage's slot j holds candidates for the token j + 1 places after the root (the token
the base model already chose, the last entry of ``history``). Every drafter is exact by
construction: verification only ever keeps tokens equal to the target's argmax.

Names (``make_drafter``): ``top1`` (vanilla BPD), ``neural`` (Algorithm 2, local rescoring
with a small LM), ``ngram`` (global n-gram rescoring, p = 1), ``parallel`` (p best rescored
paths), ``parallel-base`` (p best paths of the un-rescored lattice), ``oracle`` (best path
given the true continuation; an evaluation upper bound).

Sampling: the same drafters draft from the heads' scores perturbed by the run's Gumbel noise
(``HeadProposer``: log q_j + g_t, q_j head j's distribution after the sampling processors, g_t the
noise of the position it drafts; ``accept/sampling.py``), whose argmax is the target's sampled
token wherever the head agrees with the target; verification keeps what equals it, so any path is
exact here too. A single drafted path gets the first slot's runner-up beside it
(``with_runner_up``).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.proposers.base import Proposal, Proposer, Step, StepRows, as_paths
from latticedraft.errors import InputError
from latticedraft.gpu.verify.incremental import IncrementalLM
from latticedraft.lattice.interpolated import token_probs
from latticedraft.lattice.oracle import oracle_path
from latticedraft.lattice.rescoring import base_drafts, rescore
from latticedraft.lattice.sausage import PAD_TOKEN, Drafts, Sausage
from latticedraft.lattice.threshold import prune

PRUNES = ("none", "otsu", "static")
MAX_STEP = 1.0  # seconds: a longer gap between two steps (a pause between decode calls) counts as this


@dataclass
class LatticeOptions:
    """k: candidates per slot (top-k of each head); prune: "none" | "static" (drop arcs with
    probability < ``eps``) | "otsu" (static, then Otsu's per-slot threshold); backoff: cut
    the lattice before the first slot whose best probability is < ``backoff`` (None: keep
    all h-1 slots). Pruning is ``latticedraft.lattice.threshold.prune`` (DynaMo's order).
    slots: use only the first ``slots`` draft slots (heads 1..slots; Table 10's ablation)."""

    k: int = 16
    prune: str = "none"
    eps: float = 0.001
    backoff: float | None = None
    slots: int | None = None

    def __post_init__(self):
        if self.k < 1:
            raise InputError(f"--k must be >= 1, got {self.k}")
        if self.prune not in PRUNES:
            raise InputError(f"--prune {self.prune!r} is not one of {', '.join(PRUNES)}")
        if not 0.0 <= self.eps <= 1.0:
            raise InputError(f"--eps {self.eps} is not a probability in [0, 1]")
        if self.backoff is not None and not 0.0 <= self.backoff <= 1.0:
            raise InputError(f"--backoff {self.backoff} is not a probability in [0, 1]")
        if self.slots is not None and self.slots < 1:
            raise InputError(f"--slots {self.slots}: draft from at least 1 extra head (heads used = slots + 1)")

    def build(self, head_logits, vocab=None) -> Sausage:
        """Logits of heads 1..h-1, ``[h-1, V']`` (torch tensor or numpy) -> pruned top-k Sausage.

        ``vocab`` (int64[V'], torch or numpy): the token id of each column when the heads
        project onto a reduced draft vocabulary (the softmax is then over those V' tokens);
        None: column = token id. For a torch tensor the log-softmax and top-k run in torch (one
        fused call, no copy of the full vocabulary to numpy).
        """
        if self.slots is not None:
            head_logits = head_logits[: self.slots]
        k = min(self.k, head_logits.shape[-1])
        if isinstance(head_logits, torch.Tensor):
            val, idx = torch.topk(torch.log_softmax(head_logits.float(), dim=-1), k, dim=-1)
            if not bool(torch.isfinite(val).all()):  # NaN/inf logits make the whole row NaN
                return Sausage.from_logits(head_logits, k)  # raises, naming the slot
            if vocab is not None:
                idx = torch.as_tensor(vocab, device=idx.device)[idx]
            s = Sausage(idx.cpu().numpy(), val.cpu().numpy())
        else:
            s = Sausage.from_logits(head_logits, k)
            if vocab is not None:
                s = Sausage(np.asarray(vocab)[s.tokens], s.logp)
        if self.prune == "none" and self.backoff is None:
            return s
        return prune(
            s,
            eps=self.eps if self.prune in ("static", "otsu") else None,
            otsu=self.prune == "otsu",
            eps_b=self.backoff,
        )


class Drafter:
    """Base class; subclasses implement ``draft``. Stateless drafters share one instance.
    ``learns``: after each greedy step the proposer tells it what the target kept (``learn``)."""

    name = "base"
    learns = False

    def __init__(self, options: LatticeOptions | None = None):
        self.options = options or LatticeOptions()

    def lattice(self, head_logits, vocab=None) -> Sausage:
        """head_logits ``[h-1, V']``: heads 1..h-1 at the root (slot j = token j + 1 after it);
        vocab: the token ids of the columns (a reduced draft vocabulary) or None."""
        return self.options.build(head_logits, vocab)

    def draft(self, sausage: Sausage, history: np.ndarray) -> Drafts:
        """The paths to verify; ``Drafts.probs`` (None: ``draft_probs``, the heads' probability of
        each token) is what the cost-aware tree rates them by."""
        raise NotImplementedError

    def spawn(self, row: int = 0) -> "Drafter":
        return self

    def learn(self, sausage: Sausage, history: np.ndarray, paths: np.ndarray, tokens: int, seconds: float,
              drafted, tree=None):
        """A greedy step's end: ``paths`` int64[p, d] were drafted from ``sausage`` after ``history``,
        the step kept ``tokens`` (accepted + bonus) in this row's share of its seconds, ``drafted`` is
        what ``draft`` recorded; ``tree``: (``Step.cost``, the paths' rates, ``rate(probs) -> rates``:
        the tree's rates of tokens of those probabilities) under the cost-aware tree (None: every path
        was verified).
        Returns a record for ``settle`` (None: nothing to learn)."""

    def settle(self, record, target: np.ndarray) -> None:
        """``record`` of ``learn`` with the target's tokens after that step's root, int64[m]: the
        lattice's depth of them (fewer where the row ended first)."""


def _one(tokens) -> Drafts:
    t = np.asarray(tokens, dtype=np.int64)[None]
    return Drafts(t, np.zeros(1, dtype=np.float32), 1)


class Top1Drafter(Drafter):
    """Vanilla BPD: the argmax of every head (Algorithm 1, line 6)."""

    name = "top1"

    def draft(self, sausage, history):
        return _one(sausage.top1())


class ParallelBaseDrafter(Drafter):
    """Parallel BPD over the original lattice: the p best paths by head scores."""

    name = "parallel-base"

    def __init__(self, nbest: int = 16, options=None):
        super().__init__(options)
        self.nbest = nbest

    def draft(self, sausage, history):
        return base_drafts(sausage, self.nbest)


class NgramDrafter(Drafter):
    """Global n-gram rescoring: ``head_logp + alpha * lm_logp`` over all paths, conditioned
    on the last n-1 emitted tokens; p = nbest paths (1: "ngram", > 1: "parallel"). Each drafted
    token carries its probability under the same interpolation (``Drafts.probs``,
    ``lattice.interpolated``), so the cost-aware tree verifies the tokens the LM moved up as the
    ranking rates them, not as the heads alone do.

    ``learner``: a ``planning.rescore_weight.AlphaLearner`` whose arm (a weight, and how many arcs
    per slot the LM search ranks) replaces ``alpha`` at every step and which learns, from what the
    target kept, which arm keeps the most tokens per second (arm 0: the lattice ranked by the heads
    alone, ``base_drafts``, no LM search)."""

    name = "ngram"

    def __init__(self, lm, alpha: float = 1.0, nbest: int = 1, options=None, method: str = "exact", learner=None):
        super().__init__(options)
        self.lm, self.alpha, self.nbest, self.method = lm, alpha, nbest, method
        self.name = "ngram" if nbest == 1 else "parallel"
        self.learner, self.learns = learner, learner is not None
        self.drafted = (0, 0.0)  # the last draft's (learner's arm, seconds spent ranking)

    def ranked(self, sausage, history, alpha: float, width: int = 0) -> tuple[Drafts, float]:
        """The ``nbest`` best paths at weight ``alpha`` over the best ``width`` arcs of each slot (0:
        all), with their tokens' probabilities (alpha 0: None, the heads' own), and the seconds
        both took."""
        t0 = time.perf_counter()
        lattice = narrow(sausage, width)
        d = rescore(lattice, self.lm, alpha, self.nbest, history, method=self.method)
        if alpha != 0.0:
            d.probs = token_probs(lattice, d.tokens, self.lm, alpha, history)
        return d, time.perf_counter() - t0

    def rank(self, sausage, history, alpha: float, width: int = 0):
        """``ranked`` as the learner takes it: (paths int64[p, d], probs float[p, d], seconds)."""
        d, seconds = self.ranked(sausage, history, alpha, width)
        return d.tokens, draft_probs(sausage, d.tokens) if d.probs is None else d.probs, seconds

    def draft(self, sausage, history):
        if self.learner is None:
            return self.ranked(sausage, history, self.alpha)[0]
        arm = self.learner.arm
        d, seconds = self.ranked(sausage, history, *self.learner.arms[arm])
        self.drafted = (arm, seconds)
        return d

    def learn(self, sausage, history, paths, tokens, seconds, drafted, tree=None):
        arm, spent = drafted
        return self.learner.ranked(lambda a, w: self.rank(sausage, history, a, w), arm, paths, sausage.top1(), tokens,
                                   seconds, spent, tree)

    def settle(self, record, target):
        self.learner.observe(record, target)


def narrow(sausage: Sausage, width: int) -> Sausage:
    """The best ``width`` arcs of each slot (0, or at least k: the sausage itself)."""
    if width <= 0 or width >= sausage.k:
        return sausage
    return Sausage(np.ascontiguousarray(sausage.tokens[:, :width]), np.ascontiguousarray(sausage.logp[:, :width]))


class OracleDrafter(Drafter):
    """The path that matches the true continuation for as long as the lattice allows
    (then the heads' argmax). An upper bound for evaluation; needs the references.

    continuations: per row, the greedy continuation (int64[T]) of that row's prompt.
    """

    name = "oracle"

    def __init__(self, continuations: list, options=None):
        super().__init__(options)
        self.continuations = [np.asarray(c, dtype=np.int64) for c in continuations]
        self.cont = None
        self.prompt_len = None

    def spawn(self, row: int = 0):
        if row >= len(self.continuations):
            raise InputError(f"oracle drafter has {len(self.continuations)} references, row {row} asked")
        d = copy.copy(self)
        d.cont, d.prompt_len = self.continuations[row], None
        return d

    def draft(self, sausage, history):
        if self.cont is None:
            raise InputError("OracleDrafter.draft called before spawn(row)")
        if self.prompt_len is None:
            self.prompt_len = len(history) - 1  # the first call sees prompt + root
        at = len(history) - self.prompt_len
        ref = self.cont[at : at + sausage.h]
        if len(ref) == 0:  # past the reference's end: any draft will do
            return _one(sausage.top1())
        return _one(oracle_path(sausage, ref).tokens)


class NeuralDrafter(Drafter):
    """Algorithm 2: greedy local rescoring with a small causal LM, interpolation ``alpha``.

    For slot j the draft token is ``argmax_{y in S_j} head_logp_j(y) + alpha * r_j(y)``,
    where r_j is the rescorer's log-softmax after history + the draft so far. The rescorer
    keeps its own KV cache over the history (``IncrementalLM``), so each step costs one
    small-model call per slot (the first also catches up on the tokens accepted since the last
    step). A rescorer with fewer positions than history + h sees the latest ones only (drafts
    only, so the output stays exact). Sampling draws slot j from softmax(head_logp_j + alpha *
    r_j) over the vocabulary (after the sampling processors): q is that interpolated distribution.
    """

    name = "neural"

    def __init__(self, rescorer, alpha: float = 1.0, options=None):
        super().__init__(options)
        self.rescorer, self.alpha = rescorer, alpha
        self.lm = IncrementalLM(rescorer)

    @property
    def small_calls(self) -> int:
        return self.lm.calls

    def spawn(self, row: int = 0):
        d = copy.copy(self)
        d.lm = IncrementalLM(self.rescorer, self.lm.stack)
        return d

    @staticmethod
    def _logp(logits: torch.Tensor) -> np.ndarray:
        return torch.log_softmax(logits.float(), dim=-1).cpu().numpy()

    def draft(self, sausage, history):
        history = np.asarray(history, dtype=np.int64)
        r = self._logp(self.lm.next_logits(history, room=sausage.h))
        path = []
        for j in range(sausage.h):
            live = sausage.tokens[j] != PAD_TOKEN
            cand = sausage.tokens[j][live]
            score = sausage.logp[j][live] + self.alpha * r[cand]
            y = int(cand[int(np.argmax(score))])
            path.append(y)
            if j + 1 < sausage.h:
                r = self._logp(self.lm.push(y))
        self.lm.rewind()
        return _one(path)


def make_drafter(
    name: str,
    *,
    options: LatticeOptions | None = None,
    lm=None,
    rescorer=None,
    alpha: float | None = 1.0,
    nbest: int = 16,
    references: list | None = None,
    learner=None,
    draft_model=None,
    gamma: int = 4,
    confidence: float = 0.2,
):
    """A drafter by name (``decoding/drafters.py``): a lattice ``Drafter`` of the heads, or for
    "model" the auxiliary draft model's ``ModelProposer`` (``gamma``, ``confidence``: its options);
    the message says what is missing. ``alpha`` None: the n-gram drafters learn it (``learner``, an
    ``AlphaLearner``; None: a new one), the neural one takes 1.0."""
    if name == "top1":
        return Top1Drafter(options)
    if name == "parallel-base":
        return ParallelBaseDrafter(nbest, options)
    if name in ("ngram", "parallel"):
        if lm is None:
            raise InputError(f"drafter {name!r} needs an n-gram LM: pass --lm DIR (a build of `latticedraft lm build`)")
        if alpha is None and learner is None:
            from latticedraft.decoding.planning.rescore_weight import AlphaLearner

            learner = AlphaLearner()
        return NgramDrafter(lm, 0.0 if alpha is None else alpha, 1 if name == "ngram" else nbest, options,
                            learner=learner if alpha is None else None)
    if name == "neural":
        if rescorer is None:
            raise InputError("drafter 'neural' needs a small rescoring LM: pass --rescorer DIR")
        return NeuralDrafter(rescorer, 1.0 if alpha is None else alpha, options)
    if name == "oracle":
        if references is None:
            raise InputError("drafter 'oracle' needs the true continuations (greedy outputs) of the prompts")
        return OracleDrafter(references, options)
    if name == "model":
        if draft_model is None:
            raise InputError("drafter 'model' needs an auxiliary draft model: pass --draft-model DIR")
        from latticedraft.decoding.proposers.draft_model import ModelProposer

        return ModelProposer(draft_model, gamma, confidence)
    from latticedraft.decoding.drafters import NAMES

    raise InputError(f"unknown drafter {name!r}; choose one of {', '.join(n for n in NAMES if n != 'none')}")


class HeadProposer(Proposer):
    """Paths from the heads' lattice (sampling: the lattice of their perturbed scores, ``perturbed``)
    by one ``Drafter`` per row; a row whose step computed no heads (the head gate, no room)
    proposes nothing."""

    name = "heads"
    admits = True
    uses_heads = True

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.rows: dict[int, Drafter] = {}
        self.lattice_seconds = 0.0  # time spent building lattices (top-k + pruning), part of propose
        self.pending: dict = {}  # batch position -> (sausage, history, paths, drafted, rates) for ``learn``
        self.waiting: dict = {}  # row -> [(record, lattice depth, tokens emitted after its root)] to settle
        self.live: list = []  # the live rows at the last update, in batch order
        self.clock = None  # perf_counter of the last update

    @property
    def heads_needed(self) -> int | None:
        """Heads the verifier must compute: the base's + the drafted slots (None: all)."""
        slots = self.drafter.options.slots
        return None if slots is None else slots + 1

    def start(self, rows: StepRows) -> None:
        self.rows = {i: self.drafter.spawn(i) for i in rows.index}
        self.pending, self.waiting, self.live, self.clock = {}, {}, [], None

    def propose(self, step: Step) -> list[Proposal]:
        heads = step.head_logits
        if heads is None or heads.shape[1] == 0:
            return [Proposal.empty() for _ in step.index]
        out = []
        for j, i in enumerate(step.index):
            d, history = self.rows[i], step.histories[j]
            scores, q = (heads[j], None) if step.samplers is None else perturbed(heads[j], step.vocab, history,
                                                                                 step.samplers[j])
            t0 = time.perf_counter()
            sausage = d.lattice(scores, step.vocab)
            self.lattice_seconds += time.perf_counter() - t0
            drafts = d.draft(sausage, history)
            toks = as_paths(drafts)
            if q is not None:
                toks = with_runner_up(toks, sausage)
            rates = None
            if step.acceptance is not None:  # rated by each token's probability under the ranking (sampling: q's)
                probs = getattr(drafts, "probs", None)
                if q is not None or probs is None or probs.shape != toks.shape:
                    probs = q_probs(q, toks) if q is not None else draft_probs(sausage, toks)
                rates = step.acceptance.head_rates(probs)
            if q is None and d.learns:
                self.pending[j] = (sausage, history, toks, d.drafted, rates)
            out.append(Proposal(toks, rates=rates, sausage=sausage, heads=True))
        return out

    def update(self, step: Step, accepted: list, bonus: np.ndarray, side_argmax) -> None:
        """Teach each row's learning drafter: what the step kept after the paths it drafted, its share
        of the step's seconds (from the last update to this one, at most ``MAX_STEP``; 0 on a call's
        first step); once the row has emitted the lattice's depth of tokens after that step's root
        (the target's own path there), or ends, the record is settled against them."""
        now = time.perf_counter()
        seconds, self.clock = (0.0 if self.clock is None else min(now - self.clock, MAX_STEP)), now
        pending, self.pending, self.live = self.pending, {}, list(step.index)
        for j, i in enumerate(step.index):
            new = [int(t) for t in accepted[j]] + [int(bonus[j])]
            for item in self.waiting.get(i, ()):
                item[2].extend(new)
            if j in pending:
                sausage, history, paths, drafted, rates = pending[j]
                tree = None if step.cost is None or rates is None else (step.cost, rates, step.acceptance.head_rates)
                record = self.rows[i].learn(sausage, history, paths, len(new), seconds / len(step.index), drafted, tree)
                if record is not None:
                    self.waiting.setdefault(i, []).append((record, sausage.h, list(new)))
            if i in self.waiting:
                self._settle(i, ended=step.rooms[j] + 1 - len(new) <= 0)

    def _settle(self, i: int, ended: bool = False) -> None:
        """Settle row ``i``'s records whose target is known over their lattice (all, where it ended)."""
        left = []
        for record, depth, got in self.waiting.pop(i, ()):
            if ended or len(got) >= depth:
                self.rows[i].settle(record, np.asarray(got[:depth], dtype=np.int64))
            else:
                left.append((record, depth, got))
        if left:
            self.waiting[i] = left

    def retire(self, keep: list[int]) -> None:
        """Rows that finished settle what they still hold (their output is complete). (Positions past
        the last update's rows are rows admitted since, which hold nothing yet.)"""
        kept_rows = set(keep)
        for j, i in enumerate(self.live):
            if j not in kept_rows and i in self.waiting:
                self._settle(i, ended=True)
        self.live = [self.live[j] for j in keep if j < len(self.live)]


def perturbed(head_logits: torch.Tensor, vocab, history: np.ndarray, sampler) -> tuple[torch.Tensor, np.ndarray]:
    """The heads' scores under sampling: slot j's distribution q_j after the sampling processors
    (the repetition penalty reads the history), perturbed by the noise of the position it drafts
    (``DraftSampler.scores``; slot j drafts position len(history) + j): float32 [h-1, V'] over the
    columns ``vocab`` (None: all), a large negative number where q_j is 0; and q float64[h-1, V]."""
    h, cols = head_logits.shape[0], None if vocab is None else vocab.cpu().numpy()
    ctx = [history] * h if sampler.options.repetition_penalty != 1.0 else None
    q = sampler.probs(torch.as_tensor(head_logits), ctx, columns=cols)
    out = np.stack([sampler.scores(q[j], len(history) + j, cols) for j in range(h)])  # (the columns' noise alone)
    return torch.as_tensor(np.maximum(out, -1e30), dtype=torch.float32), q


def with_runner_up(paths: np.ndarray, sausage: Sausage) -> np.ndarray:
    """Under sampling, a single drafted path gets a second: the first slot's runner-up (its best
    perturbed score other than the path's own token) alone. The target's sampled token is the draft's perturbed
    argmax only as often as the two couple, and among its top two much more often (bundled
    model, held-back code: 1.49 -> 1.61 tokens per call at T = 1, 1.62 -> 1.75 at T = 0.7);
    one more node. paths int64[1, d] -> int64[2, d] (others unchanged)."""
    if paths.shape[0] != 1 or paths.shape[1] == 0 or sausage.h == 0:
        return paths
    others = [t for t in sausage.tokens[0][:2] if t >= 0 and t != paths[0, 0]]  # (slot arcs best first)
    if not others:
        return paths
    alt = np.full((1, paths.shape[1]), -1, dtype=np.int64)
    alt[0, 0] = others[0]
    return np.concatenate([paths, alt])


def q_probs(q: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """q_j of every draft token: float[p, d] from q float64[h-1, V] (0 at the end of a path)."""
    p, d = drafts.shape
    cols = np.arange(d)[None, :].repeat(p, 0)
    return np.where(drafts >= 0, q[np.minimum(cols, q.shape[0] - 1), np.maximum(drafts, 0)], 0.0)


def draft_probs(sausage, drafts: np.ndarray) -> np.ndarray:
    """The head probability of every draft token: float[p, d] (0 where the slot lacks it)."""
    p, d = drafts.shape
    out = np.zeros((p, d))
    for j in range(min(d, sausage.h)):
        hit = sausage.tokens[j][None, :] == drafts[:, j : j + 1]  # [p, k]
        out[:, j] = np.where(hit, np.exp(sausage.logp[j].astype(np.float64))[None, :], 0.0).max(axis=1)
    return out
