"""Drafters: turn one step's sausage lattice into the drafts the target verifies.

One small interface (after vLLM's proposers and HF's ``CandidateGenerator``)::

    class Drafter:
        lattice(head_logp: float32[h-1, V]) -> Sausage   # top-k + pruning (LatticeOptions)
        draft(sausage, history: int64[t]) -> Drafts       # tokens int64[p, d], scores float32[p]
        update(accepted: int64[n]) -> None                # optional: what the target kept
        spawn(row: int) -> Drafter                        # per-sequence copy (own state)
        sample(head_logits, vocab, history, sampler, room)  # lossless sampling: (tokens, q or None)

The sausage's slot j holds candidates for the token j + 1 places after the root (the token
the base model already chose, the last entry of ``history``). Every drafter is exact by
construction: verification only ever keeps tokens equal to the target's argmax.

Names (``make_drafter``): ``top1`` (vanilla BPD), ``neural`` (Algorithm 2, local rescoring
with a small LM), ``ngram`` (global n-gram rescoring, p = 1), ``parallel`` (p best rescored
paths), ``parallel-base`` (p best paths of the un-rescored lattice), ``oracle`` (best path
given the true continuation; an evaluation upper bound), ``model`` (an auxiliary draft model,
classic speculative decoding; ``uses_heads`` False: it drafts from the history alone).

Sampling (``sample``): drafters with a distribution draw their drafts from it and return it as
q (``spec_sampling.py`` then accepts with min(1, p/q)): ``top1`` one path and
``parallel-base`` ``nbest`` i.i.d. paths from the heads' softmax (after the sampling warpers),
``neural`` from its interpolated distribution, ``model`` from the draft model's. The lattice
rescorers (``ngram``, ``parallel``) and ``oracle`` keep their deterministic paths: a path
that is a function of the heads' logits and the history is a draw from a point mass, so it is
verified as a one-hot draft (q = one-hot), which is exact, while sampling a path from the
rescored lattice's normalised distribution would need that distribution over all k^h paths.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.verify.kvcache import cache_length, crop_to
from latticedraft.gpu.verify.verifier import position_limit
from latticedraft.lattice.oracle import oracle_path
from latticedraft.lattice.rescoring import base_drafts, rescore
from latticedraft.lattice.sausage import PAD_TOKEN, Drafts, Sausage
from latticedraft.lattice.threshold import prune

DRAFTERS = ("top1", "neural", "ngram", "parallel", "parallel-base", "oracle", "model")
PRUNES = ("none", "otsu", "static")


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
    """Base class; subclasses implement ``draft``. Stateless drafters share one instance."""

    name = "base"
    uses_heads = True  # False: drafts from the history alone (``draft(None, history)``)

    def __init__(self, options: LatticeOptions | None = None):
        self.options = options or LatticeOptions()

    def lattice(self, head_logits, vocab=None) -> Sausage:
        """head_logits ``[h-1, V']``: heads 1..h-1 at the root (slot j = token j + 1 after it);
        vocab: the token ids of the columns (a reduced draft vocabulary) or None."""
        return self.options.build(head_logits, vocab)

    def draft(self, sausage: Sausage, history: np.ndarray) -> Drafts:
        raise NotImplementedError

    def update(self, accepted: np.ndarray) -> None:
        """Told the draft tokens the target accepted this step (default: ignored)."""

    def spawn(self, row: int = 0) -> "Drafter":
        return self

    def sample(self, head_logits, vocab, history: np.ndarray, sampler, room: int):
        """Drafts for lossless sampling: (tokens int64[p, d], q float64[p, d, V] the distribution
        each token was drawn from, or None: deterministic drafts, verified as one-hot), d <= room
        (nothing is drawn past it). head_logits ``[h-1, V']`` as ``lattice``; sampler: a
        ``spec_sampling.DraftSampler``. Default: this drafter's deterministic paths."""
        d = self.draft(self.lattice(head_logits, vocab), history)
        return np.atleast_2d(np.asarray(getattr(d, "tokens", d), dtype=np.int64))[:, :room], None


def sample_head_paths(head_logits, vocab, history: np.ndarray, sampler, paths: int):
    """``paths`` i.i.d. drafts from the heads: token j of each is drawn from the softmax of head
    j + 1 after the sampling processors. Returns (int64[paths, h-1], float64[paths, h-1, V])."""
    h = head_logits.shape[0]
    rep = sampler.options.repetition_penalty != 1.0
    shared = None if rep else sampler.probs(torch.as_tensor(head_logits), columns=vocab)  # [h-1, V]
    toks = np.zeros((paths, h), dtype=np.int64)
    qs = np.zeros((paths, h, sampler.vocab_size))
    for i in range(paths):
        for j in range(h):
            if rep:
                ctx = [np.concatenate([history, toks[i, :j]])]
                q = sampler.probs(torch.as_tensor(head_logits[j : j + 1]), ctx, columns=vocab)[0]
            else:
                q = shared[j]
            qs[i, j] = q
            toks[i, j] = sampler.draw(q)
    return toks, qs


def _one(tokens) -> Drafts:
    t = np.asarray(tokens, dtype=np.int64)[None]
    return Drafts(t, np.zeros(1, dtype=np.float32), 1)


class Top1Drafter(Drafter):
    """Vanilla BPD: the argmax of every head (Algorithm 1, line 6)."""

    name = "top1"

    def draft(self, sausage, history):
        return _one(sausage.top1())

    def sample(self, head_logits, vocab, history, sampler, room):
        return sample_head_paths(_slots(head_logits, self.options, room), vocab, history, sampler, 1)


def _slots(head_logits, options, room: int):
    """The heads drafted from: the first ``options.slots`` (all: None), at most ``room``."""
    n = room if options.slots is None else min(options.slots, room)
    return head_logits[:n]


class ParallelBaseDrafter(Drafter):
    """Parallel BPD over the original lattice: the p best paths by head scores."""

    name = "parallel-base"

    def __init__(self, nbest: int = 16, options=None):
        super().__init__(options)
        self.nbest = nbest

    def draft(self, sausage, history):
        return base_drafts(sausage, self.nbest)

    def sample(self, head_logits, vocab, history, sampler, room):
        """A tree of ``nbest`` i.i.d. sampled paths (SpecInfer's sampled token tree)."""
        return sample_head_paths(_slots(head_logits, self.options, room), vocab, history, sampler, self.nbest)


class NgramDrafter(Drafter):
    """Global n-gram rescoring: ``head_logp + alpha * lm_logp`` over all paths, conditioned
    on the last n-1 emitted tokens; p = nbest paths (1: "ngram", > 1: "parallel")."""

    name = "ngram"

    def __init__(self, lm, alpha: float = 1.0, nbest: int = 1, options=None, method: str = "exact"):
        super().__init__(options)
        self.lm, self.alpha, self.nbest, self.method = lm, alpha, nbest, method
        self.name = "ngram" if nbest == 1 else "parallel"

    def draft(self, sausage, history):
        return rescore(sausage, self.lm, self.alpha, self.nbest, history, method=self.method)


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


class IncrementalLM:
    """A small causal LM that keeps its own KV cache over a growing history: ``next_logp(history)``
    returns its log-softmax after ``history`` (float32[V]), feeding only the tokens the cache
    lacks (it starts over where the history diverged from what it holds); ``push(token)`` feeds
    one drafted token; ``rewind()`` crops back to the last history fed. A model with fewer
    positions than the history + the tokens to be pushed sees the latest positions only (drafts
    only: the cache then starts over each step). ``calls`` counts forwards."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache, self.fed, self.calls, self.mark = None, np.zeros(0, dtype=np.int64), 0, 0
        self.limit = position_limit(model)

    @torch.inference_mode()
    def _run(self, ids: np.ndarray) -> torch.Tensor:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache()
        x = torch.as_tensor(np.asarray(ids, dtype=np.int64)[None], device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True)
        self.calls += 1
        self.fed = np.concatenate([self.fed, np.asarray(ids, dtype=np.int64)])
        return out.logits[0, -1]

    def next_logits(self, history: np.ndarray, room: int = 0) -> torch.Tensor:
        """Raw logits [V] after ``history`` (int64[t], t >= 1); room: tokens to be pushed after it."""
        history = np.asarray(history, dtype=np.int64)
        if self.limit and len(history) + room > self.limit:  # fewer positions: the latest ones only
            history = history[len(history) + room - self.limit:]
        n = len(self.fed)
        if n == 0 or n > len(history) or not np.array_equal(history[:n], self.fed):
            self.cache, self.fed, n = None, np.zeros(0, dtype=np.int64), 0  # diverged: start over
        if n == len(history):  # nothing new: re-run the last token to get its logits
            self.rewind(n - 1)
            n -= 1
        out = self._run(history[n:])
        self.mark = len(self.fed)
        return out

    def push(self, token: int) -> torch.Tensor:
        """Feed one token; raw logits [V] after it."""
        return self._run(np.asarray([token], dtype=np.int64))

    def rewind(self, n: int | None = None) -> None:
        """Crop back to the first n tokens (default: the history of the last ``next_logits``)."""
        n = self.mark if n is None else n
        crop_to(self.cache, n)
        self.fed = self.fed[:n]
        assert cache_length(self.cache) == n


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
        d.lm = IncrementalLM(self.rescorer)
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

    def sample(self, head_logits, vocab, history, sampler, room):
        history = np.asarray(history, dtype=np.int64)
        head_logits = _slots(head_logits, self.options, room)
        h, V = head_logits.shape[0], sampler.vocab_size
        head_logp = torch.log_softmax(torch.as_tensor(head_logits).double(), dim=-1)
        full = torch.full((h, V), -float("inf"), dtype=torch.float64)
        full[:, torch.as_tensor(vocab) if vocab is not None else torch.arange(head_logp.shape[-1])] = head_logp
        r = self.lm.next_logits(history, room=h)
        toks = np.zeros((1, h), dtype=np.int64)
        qs = np.zeros((1, h, V))
        for j in range(h):
            score = full[j] + self.alpha * torch.log_softmax(r.double(), dim=-1)[:V]
            ctx = [np.concatenate([history, toks[0, :j]])]
            qs[0, j] = sampler.probs(score[None], ctx)[0]
            toks[0, j] = sampler.draw(qs[0, j])
            if j + 1 < h:
                r = self.lm.push(int(toks[0, j]))
        self.lm.rewind()
        return toks, qs


class ModelDrafter(Drafter):
    """Classic speculative decoding's drafter: an auxiliary causal LM with the target's
    vocabulary drafts ``gamma`` tokens after the history, greedily (its argmax: exact greedy
    decoding) or, for sampling, each drawn from its distribution after the sampling processors
    (q). Keeps its own KV cache (``IncrementalLM``); needs no heads."""

    name = "model"
    uses_heads = False

    def __init__(self, draft_model, gamma: int = 4):
        super().__init__(None)
        if gamma < 1:
            raise InputError(f"--gamma {gamma}: the draft model drafts at least 1 token per step")
        self.draft_model, self.gamma = draft_model, int(gamma)
        self.lm = IncrementalLM(draft_model)

    def spawn(self, row: int = 0):
        d = copy.copy(self)
        d.lm = IncrementalLM(self.draft_model)
        return d

    def draft(self, sausage, history):
        history = np.asarray(history, dtype=np.int64)
        x = self.lm.next_logits(history, room=self.gamma)
        path = []
        for j in range(self.gamma):
            path.append(int(torch.argmax(x)))
            if j + 1 < self.gamma:
                x = self.lm.push(path[-1])
        self.lm.rewind()
        return _one(path)

    def sample(self, head_logits, vocab, history, sampler, room):
        history = np.asarray(history, dtype=np.int64)
        n = min(self.gamma, room)
        toks = np.zeros((1, n), dtype=np.int64)
        qs = np.zeros((1, n, sampler.vocab_size))
        if n == 0:
            return toks, qs
        x = self.lm.next_logits(history, room=n)
        for j in range(n):
            qs[0, j] = sampler.probs(x[None], [np.concatenate([history, toks[0, :j]])])[0]
            toks[0, j] = sampler.draw(qs[0, j])
            if j + 1 < n:
                x = self.lm.push(int(toks[0, j]))
        self.lm.rewind()
        return toks, qs


def make_drafter(
    name: str,
    *,
    options: LatticeOptions | None = None,
    lm=None,
    rescorer=None,
    alpha: float = 1.0,
    nbest: int = 16,
    references: list | None = None,
    draft_model=None,
    gamma: int = 4,
) -> Drafter:
    """A drafter by name (see ``DRAFTERS``), with a message that says what is missing."""
    if name == "top1":
        return Top1Drafter(options)
    if name == "parallel-base":
        return ParallelBaseDrafter(nbest, options)
    if name in ("ngram", "parallel"):
        if lm is None:
            raise InputError(f"drafter {name!r} needs an n-gram LM: pass --lm DIR (a build of `latticedraft lm build`)")
        return NgramDrafter(lm, alpha, 1 if name == "ngram" else nbest, options)
    if name == "neural":
        if rescorer is None:
            raise InputError("drafter 'neural' needs a small rescoring LM: pass --rescorer DIR")
        return NeuralDrafter(rescorer, alpha, options)
    if name == "oracle":
        if references is None:
            raise InputError("drafter 'oracle' needs the true continuations (greedy outputs) of the prompts")
        return OracleDrafter(references, options)
    if name == "model":
        if draft_model is None:
            raise InputError("drafter 'model' needs an auxiliary draft model: pass --draft-model DIR")
        return ModelDrafter(draft_model, gamma)
    raise InputError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
