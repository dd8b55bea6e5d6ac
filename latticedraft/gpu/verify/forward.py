"""One target call's results, and transformers' own forward as the verifier's fallback.

``Forward`` holds either the logits [b, s, V] or, lazily, the final hidden states [b, s, H] from
which the output projection and the extra heads run only at the nodes asked for (the accept
walk's, the accepted node's). ``hf_forward`` runs a model through transformers (any causal LM,
any head kind); ``lean.LeanStack`` runs the supported ones without it. ``DraftVocab`` is the
reduced vocabulary the extra heads project onto.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.models import hf
from latticedraft.gpu.verify.modes import base_config
from latticedraft.gpu.verify.screened_argmax import argmax_projection
from latticedraft.gpu.verify.screened_topk import topk_projection
from latticedraft.gpu.verify.sparse_logits import SparseLogits


class Forward:
    """One target call. Either ``logits`` [b, s, V] (a plain causal LM, or a base whose logits
    are not the plain output projection) or, for a lazy call, ``hidden`` [b, s, H], the final
    hidden states, from which the output projection and the heads run only where asked for."""

    def __init__(self, model, out=None, hidden=None, num_heads: int | None = None, unembed=None):
        self.model, self.out, self.hidden = model, out, hidden
        self.unembed = unembed if unembed is not None else getattr(model, "unembed", None)
        self.lazy = hidden is not None
        self.argmax = argmax_projection(self.unembed) if self.lazy else None
        self.logits = None if self.lazy else out.logits
        self.num_heads = num_heads
        self.project_all = False  # lazy calls: project every node at the first argmax (set by the verifier)
        self.top_k = None  # lazy calls: logits_at need only what a top-k of top_k reads (set by the verifier)
        self.seconds = 0.0  # time spent in argmax_at / logits_at (the output projection and the argmax)
        self.projections = 0  # output projections run by argmax_at / prefetch (lazy calls)
        self._argmax = None  # lazy calls: int64[b, s], the argmax of each node projected so far (-1: not yet)
        self._kept = {}  # lazy calls: (row, node) -> logits [V] kept for logits_at

    def prefetch(self, rows, nodes, logits: bool = False) -> None:
        """Lazy calls: project nodes ``nodes[j]`` of rows ``rows[j]`` now, in one matmul, for the
        ``argmax_at`` (or, with ``logits``, ``logits_at``) calls to come: the nodes the walk
        will most likely visit."""
        if self.lazy and self.logits is None and len(rows):
            rows, nodes = np.asarray(rows, dtype=np.int64), np.asarray(nodes, dtype=np.int64)
            if logits:
                self._project(rows, nodes, keep=True)
            else:
                self._project_argmax(rows, nodes)

    def _argmax_table(self) -> np.ndarray:
        if self._argmax is None:
            self._argmax = np.full(self.hidden.shape[:2], -1, dtype=np.int64)
        return self._argmax

    def _selected(self, rows: np.ndarray, nodes: np.ndarray) -> torch.Tensor:
        dev = self.hidden.device
        return self.hidden[torch.from_numpy(rows).to(dev), torch.from_numpy(nodes).to(dev)]

    def _project(self, rows: np.ndarray, nodes: np.ndarray, keep: bool = False):
        """The logits [m, V] of the given nodes (with ``top_k``: what a top-k reads, possibly as
        ``SparseLogits``); records their argmax (and, with ``keep``, the logits themselves) for
        later calls."""
        t0 = time.perf_counter()
        h = self._selected(rows, nodes)
        z = self.unembed(h) if self.top_k is None else topk_projection(self.unembed, self.top_k)(h)
        sparse = isinstance(z, SparseLogits)
        self._argmax_table()[rows, nodes] = z.argmax() if sparse else z.argmax(dim=-1).cpu().numpy()
        if keep:
            self._kept.update(zip(zip(rows.tolist(), nodes.tolist()), z.split() if sparse else z))
        self.projections += 1
        self.seconds += time.perf_counter() - t0
        return z

    def _project_argmax(self, rows: np.ndarray, nodes: np.ndarray) -> None:
        """Records the argmax of the given nodes (``ArgmaxProjection``: no logits kept)."""
        t0 = time.perf_counter()
        self._argmax_table()[rows, nodes] = self.argmax(self._selected(rows, nodes))
        self.projections += 1
        self.seconds += time.perf_counter() - t0

    def _project_all(self) -> None:
        """Lazy calls: the logits of every node, in one matmul (once); with ``top_k``, what a top-k
        reads, kept per node for ``logits_at``."""
        if self.lazy and self.top_k is not None:
            if not self._kept:
                b, n = self.hidden.shape[:2]
                self._project(np.repeat(np.arange(b), n), np.tile(np.arange(n), b), keep=True)
        elif self.lazy and self.logits is None:
            t0 = time.perf_counter()
            b, n, H = self.hidden.shape
            self.logits = self.unembed(self.hidden.reshape(-1, H)).view(b, n, -1)
            self.projections += 1
            self.seconds += time.perf_counter() - t0

    def argmax_at(self, rows, nodes) -> np.ndarray:
        """The base model's greedy token after node ``nodes[j]`` of row ``rows[j]``: int64[m].

        Lazy calls project either every node at the first call (``project_all``) or the nodes
        not projected yet (``prefetch``), one small projection per call; the verifier picks from
        the measured projection cost and the walk's measured depth. Only the argmax is computed
        (``ArgmaxProjection``), not the logits."""
        if self.lazy and self.logits is None:
            rows, nodes = np.asarray(rows, dtype=np.int64), np.asarray(nodes, dtype=np.int64)
            if self._argmax is None and self.project_all:
                t0 = time.perf_counter()
                b, n, H = self.hidden.shape
                self._argmax = self.argmax(self.hidden.reshape(-1, H)).reshape(b, n)
                self.projections += 1
                self.seconds += time.perf_counter() - t0
            miss = self._argmax_table()[rows, nodes] < 0
            if miss.any():
                self._project_argmax(rows[miss], nodes[miss])
            return self._argmax[rows, nodes]
        t0 = time.perf_counter()
        r = torch.as_tensor(rows, dtype=torch.long, device=self.logits.device)
        n = torch.as_tensor(nodes, dtype=torch.long, device=self.logits.device)
        out = self.logits[r, n].argmax(dim=-1).cpu().numpy()
        self.seconds += time.perf_counter() - t0
        return out

    def logits_at(self, rows, nodes):
        """The base model's logits after node ``nodes[j]`` of row ``rows[j]``: [m, V]. With
        ``top_k`` set on a lazy call, what a top-k of k reads: ``SparseLogits`` where the output
        projection is screened (``screened_topk``), else the whole logits."""
        if self.project_all:
            self._project_all()
        if self.logits is not None:
            r = torch.as_tensor(rows, dtype=torch.long, device=self.logits.device)
            return self.logits[r, torch.as_tensor(nodes, dtype=torch.long, device=self.logits.device)]
        rows, nodes = np.asarray(rows, dtype=np.int64), np.asarray(nodes, dtype=np.int64)
        kept = self._kept
        miss = np.asarray([(r, n) not in kept for r, n in zip(rows.tolist(), nodes.tolist())], dtype=bool)
        if miss.all():
            return self._project(rows, nodes)
        if miss.any():
            self._project(rows[miss], nodes[miss], keep=True)
        parts = [kept[(r, n)] for r, n in zip(rows.tolist(), nodes.tolist())]
        if all(isinstance(p, SparseLogits) for p in parts):
            return SparseLogits.stack(parts)
        return torch.stack([p.dense()[0] if isinstance(p, SparseLogits) else p for p in parts])

    def draft_heads_at(self, nodes: torch.Tensor, vocab: "DraftVocab | None" = None,
                       next_tokens: np.ndarray | None = None) -> torch.Tensor:
        """The extra heads' logits (heads 1..num_heads-1, what the next lattice is built from)
        at node ``nodes[i]`` of row i: [b, h-1, V'] (V' = ``len(vocab)`` when a reduced draft
        vocabulary is given, else V; [b, 0, V] for a model without heads). The base model's
        own head is not projected here: its argmax at that node is the walk's bonus token.
        next_tokens int64[b]: the token emitted after each node (the walk's bonus, which
        token-input heads read: sampled, it need not be the argmax); None: the argmax there."""
        if self.lazy:  # position-wise heads: run them on the b selected final hidden states only
            hid = self.hidden[torch.arange(len(nodes), device=self.hidden.device), nodes.to(self.hidden.device)]
            extra = 0 if not hasattr(self.model, "draft_logits") else (
                self.model.num_heads if self.num_heads is None else self.num_heads) - 1
            if extra <= 0:  # the base model's head only (no drafting heads)
                return hid.new_zeros(len(nodes), 0, len(vocab) if vocab is not None else
                                     hf.model_vocab_size(getattr(self.model, "base", self.model)))
            nxt = None
            if getattr(self.model, "token_input", False):  # the token emitted there (the walk's bonus)
                if next_tokens is None:
                    at = nodes.cpu().numpy()
                    next_tokens = self.argmax_at(np.arange(len(at)), at)
                nxt = torch.as_tensor(np.asarray(next_tokens, dtype=np.int64), device=hid.device)
            return self.model.draft_logits(hid, extra, None if vocab is None else vocab.ids, next_tokens=nxt)
        b = self.logits.shape[0]
        rows = torch.arange(b, device=self.logits.device)
        nodes = nodes.to(self.logits.device)
        if not hasattr(self.model, "head_logits_from"):
            return self.logits.new_zeros(b, 0, self.logits.shape[-1])
        uniq, inv = torch.unique(nodes, return_inverse=True)
        hl = self.model.head_logits_from(self.out, uniq)  # [b, u, h, V]: heads only where needed
        hl = hl[rows, inv][:, 1 : self.num_heads]
        return hl if vocab is None else hl.index_select(-1, vocab.ids.to(hl.device))


class DraftVocab:
    """A reduced vocabulary the extra heads project onto (FR-Spec, EAGLE-3): the V' most
    frequent token ids of the training corpus. Drafting only: verification always uses the full
    vocabulary in the model's dtype, so the output is unchanged. ids: int64[V'] token ids (the
    heads project onto them: ``BlockwiseModel.draft_logits(..., columns=ids)``)."""

    def __init__(self, model, ids):
        lm = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if lm is None:
            lm = getattr(model, "base", model).get_output_embeddings()
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        V = int(lm.weight.shape[0])
        if len(ids) == 0 or ids[0] < 0 or ids[-1] >= V:
            raise InputError(f"draft vocabulary ids must lie in [0, {V}) and be non-empty; got {len(ids)} ids "
                             f"in [{ids.min() if len(ids) else '-'}, {ids.max() if len(ids) else '-'}]")
        self.ids = torch.as_tensor(ids, device=lm.weight.device)

    def __len__(self) -> int:
        return int(self.ids.shape[0])


_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def lazy_logits_ok(model) -> bool:
    """True when logits may be computed later from the final hidden states with the output
    embedding alone (``model.unembed``): a ``BlockwiseModel`` with position-wise heads (Stern,
    Medusa: ``draft_logits``) whose base applies no soft-capping or scaling to its logits."""
    if not getattr(model, "position_wise", False) or not hasattr(model, "unembed"):
        return False
    cfg = base_config(model)
    return all(getattr(cfg, a, None) in (None, 1.0) for a in _LOGIT_TRANSFORMS)


def hf_forward(model, input_ids, attention_mask, position_ids, cache, lazy: bool = False,
               num_heads: int | None = None) -> Forward:
    """One target call; works for a BlockwiseModel (Stern heads) and for a plain HF causal LM.
    Heads are computed afterwards only at the nodes asked for (``Forward.draft_heads_at``; the first
    ``num_heads``, default all). With ``lazy`` only the decoder backbone runs (no output
    projection, no hidden-state recording): a tree of N nodes pays the projection only for the
    nodes the accept walk visits, and the call costs what a plain decoder call costs."""
    kw = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
              **hf.cache_arg(cache))
    if lazy:
        out = hf.backbone(model.base)(**kw)
        return Forward(model, hidden=out.last_hidden_state, num_heads=num_heads)
    if hasattr(model, "head_logits_from"):
        kw["heads"] = False
    return Forward(model, out=model(**kw), num_heads=num_heads)
