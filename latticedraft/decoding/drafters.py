"""Drafters: turn one step's sausage lattice into the drafts the target verifies.

One small interface (after vLLM's proposers and HF's ``CandidateGenerator``)::

    class Drafter:
        lattice(head_logp: float32[h-1, V]) -> Sausage   # top-k + pruning (LatticeOptions)
        draft(sausage, history: int64[t]) -> Drafts       # tokens int64[p, d], scores float32[p]
        update(accepted: int64[n]) -> None                # optional: what the target kept
        spawn(row: int) -> Drafter                        # per-sequence copy (own state)

The sausage's slot j holds candidates for the token j + 1 places after the root (the token
the base model already chose, the last entry of ``history``). Every drafter is exact by
construction: verification only ever keeps tokens equal to the target's argmax.

Names (``make_drafter``): ``top1`` (vanilla BPD), ``neural`` (Algorithm 2, local rescoring
with a small LM), ``ngram`` (global n-gram rescoring, p = 1), ``parallel`` (p best rescored
paths), ``parallel-base`` (p best paths of the un-rescored lattice), ``oracle`` (best path
given the true continuation; an evaluation upper bound).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.kvcache import cache_length, crop_to
from latticedraft.gpu.verify import position_limit
from latticedraft.lattice.oracle import oracle_path
from latticedraft.lattice.rescoring import base_drafts, rescore
from latticedraft.lattice.sausage import PAD_TOKEN, Drafts, Sausage
from latticedraft.lattice.threshold import prune

DRAFTERS = ("top1", "neural", "ngram", "parallel", "parallel-base", "oracle")
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


class NeuralDrafter(Drafter):
    """Algorithm 2: greedy local rescoring with a small causal LM, interpolation ``alpha``.

    For slot j the draft token is ``argmax_{y in S_j} head_logp_j(y) + alpha * r_j(y)``,
    where r_j is the rescorer's log-softmax after history + the draft so far. The rescorer
    keeps its own KV cache over the history, so each step costs one small-model call per
    slot (the first also catches up on the tokens accepted since the last step). A rescorer
    with fewer positions than history + h sees the latest ones only (its cache then restarts
    every step; drafts only, so the output stays exact).
    """

    name = "neural"

    def __init__(self, rescorer, alpha: float = 1.0, options=None):
        super().__init__(options)
        self.rescorer, self.alpha = rescorer, alpha
        self.device = next(rescorer.parameters()).device
        self._cache = None
        self._fed = np.zeros(0, dtype=np.int64)
        self.small_calls = 0

    def spawn(self, row: int = 0):
        d = copy.copy(self)
        d._cache, d._fed, d.small_calls = None, np.zeros(0, dtype=np.int64), 0
        return d

    @torch.inference_mode()
    def _step(self, ids: np.ndarray) -> np.ndarray:
        from transformers import DynamicCache

        if self._cache is None:
            self._cache = DynamicCache()
        x = torch.as_tensor(ids[None], device=self.device)
        out = self.rescorer(input_ids=x, past_key_values=self._cache, use_cache=True)
        self.small_calls += 1
        return torch.log_softmax(out.logits[0, -1].float(), dim=-1).cpu().numpy()

    def draft(self, sausage, history):
        history = np.asarray(history, dtype=np.int64)
        limit = position_limit(self.rescorer)
        if limit and len(history) + sausage.h > limit:  # a rescorer with fewer positions sees the latest ones
            history = history[len(history) + sausage.h - limit:]
        n = len(self._fed)
        if n == 0 or n > len(history) or not np.array_equal(history[:n], self._fed):
            self._cache, n = None, 0  # history diverged from what the cache holds: start over
        if n == len(history):  # nothing new: re-run the last token to get its logits
            n -= 1
            crop_to(self._cache, n)
        r = self._step(history[n:])
        self._fed = history.copy()
        path = []
        for j in range(sausage.h):
            live = sausage.tokens[j] != PAD_TOKEN
            cand = sausage.tokens[j][live]
            score = sausage.logp[j][live] + self.alpha * r[cand]
            y = int(cand[int(np.argmax(score))])
            path.append(y)
            if j + 1 < sausage.h:
                r = self._step(np.asarray([y], dtype=np.int64))
        crop_to(self._cache, len(history))
        assert cache_length(self._cache) == len(history)
        return _one(path)


def make_drafter(
    name: str,
    *,
    options: LatticeOptions | None = None,
    lm=None,
    rescorer=None,
    alpha: float = 1.0,
    nbest: int = 16,
    references: list | None = None,
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
    raise InputError(f"unknown drafter {name!r}; choose one of {', '.join(DRAFTERS)}")
