"""Verify drafts against the target model's greedy choice in one forward per step.

Two modes, chosen automatically by ``choose_mode`` and reported in every result:

- ``"tree"``: the p drafts of each row are merged into a prefix trie (``tree.py``) and run
  as one sequence of N nodes with a 4-D additive attention mask ``[b, 1, N, L + N]`` (each
  node sees the valid cache slots and its own ancestors) and per-node position ids
  ``next_pos + depth``. transformers passes a 4-D mask through unchanged
  (``masking_utils._preprocess_mask_arguments``), so the mask must also carry the sliding
  window of Mistral-style models: a key is visible iff ``key_pos > query_pos - window``.
- ``"batched"``: the fallback for models whose attention takes no custom 4-D mask (flash
  attention, mixed sliding/full layers): every draft is a batch row ``[root, draft...]``
  over a copy of the row's cache, with a 2-D padding mask. Costs p copies of the cache.

Both accept, per row, the longest draft prefix equal to the target's argmax and one bonus
token (the argmax after the last accepted node), keep exactly the accepted nodes in the
cache (``SlotCache.commit``) and return the heads' logits at the last accepted node, which
drive the next step's lattice, so predicting and verifying share one call (Stern et al.).

With ``choose`` (sampling verification, e.g. ``decoding/spec_sampling.py``) the walk asks
``choose(rows, logits [m, V], prefixes, logits_at)`` for the token at each walked node instead
of the argmax (``prefixes[j]``: the draft tokens from the root to that node; ``logits_at(rows,
prefixes) -> [m, V]`` the target's logits at any other node of the same trees, for rules that
look down a path, such as MTAD's): a returned child is accepted and the walk goes on, any
other token is the bonus (a chooser may return ``(tokens, stop bool[m])`` to make a child
token the bonus where ``stop``). The prefill's first token comes from it too (prefixes all empty).
The verifier itself stays free of any algorithm.

Sliding-window models in tree mode keep a rolling-buffer cache by default (``kv_cache``, see
``choose_kv_cache``): W slots per layer, position p in slot p mod W (``kvcache.py``), prompts
prefilled in chunks of W (``prefill.py``); the masks above are built from slot positions, so trees,
side branches and rows of different accepted lengths read exactly the keys inside their window.

A step may carry a *side branch* per row (``side_branch.py``: lookahead decoding's Jacobi
window): nodes run in the same forward with their own visibility, never accepted, whose
argmax is returned in ``StepResult.side_argmax``. In tree mode they sit between the root and
the tree (Figure 2(b) of Fu et al. 2024); the batched fallback runs each wanted side node's
chain as one more batch row.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf
from latticedraft.gpu.verify.kvcache import SlotCache, cache_bytes
from latticedraft.gpu.verify.prefill import chunked_prefill, window_mask
from latticedraft.gpu.verify.side_branch import SideBranch, step_layout
from latticedraft.gpu.verify.tree import build_tree, pack_trees

MODES = ("auto", "tree", "batched")


def base_config(model):
    """The HF config of a causal LM or of a BlockwiseModel's base."""
    base = getattr(model, "base", None)
    return (base if base is not None else model).config


def sliding_window(model) -> int | None:
    """The attention window in tokens, or None for full attention."""
    cfg = base_config(model)
    if getattr(cfg, "use_sliding_window", True) is False:
        return None
    w = getattr(cfg, "sliding_window", None)
    return int(w) if w else None


def choose_mode(model, requested: str = "auto") -> tuple[str, str]:
    """("tree" | "batched", why). ``requested`` other than "auto" is honoured if possible."""
    if requested not in MODES:
        raise InputError(f"verify mode {requested!r} is not one of {', '.join(MODES)}")
    cfg = base_config(model)
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    layer_types = set(getattr(cfg, "layer_types", None) or [])
    if getattr(cfg, "is_encoder_decoder", False):
        raise ModelError(f"{type(model).__name__} is an encoder-decoder model; BPD needs a causal LM")
    problem = None
    if impl not in ("eager", "sdpa"):
        problem = f"attention implementation {impl!r} takes no custom 4-D mask"
    elif len(layer_types) > 1:
        problem = f"mixed layer types {sorted(layer_types)} need different masks per layer"
    if requested == "tree" and problem:
        raise ModelError(f"tree verification impossible: {problem}; use --verify batched")
    if requested == "batched":
        return "batched", "requested"
    if problem:
        return "batched", problem
    return "tree", f"{impl} attention accepts a 4-D tree mask"


KV_CACHES = ("auto", "full", "rolling")


def choose_kv_cache(window: int | None, mode: str, requested: str = "auto") -> bool:
    """Whether verification keeps a rolling buffer of W slots (``kvcache.SlotCache``) instead of
    every position. "auto": rolling for sliding-window models in tree mode (the only mode whose
    masks are built from positions, not slot order); "rolling" fails where it cannot apply."""
    if requested not in KV_CACHES:
        raise InputError(f"--kv-cache {requested!r} is not one of {', '.join(KV_CACHES)}")
    if requested == "rolling" and window is None:
        raise ModelError("--kv-cache rolling needs a sliding-window model (config.sliding_window); use --kv-cache full")
    if requested == "rolling" and mode != "tree":
        raise ModelError(f"--kv-cache rolling needs tree verification (this model verifies in {mode} mode); "
                         "use --kv-cache full")
    return requested != "full" and window is not None and mode == "tree"


def attention_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool[b, N, K] (True = may attend) -> additive float mask [b, 1, N, K] (0 or dtype min)."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]


def position_limit(model) -> int | None:
    """The number of position ids the model embeds (GPT-2's n_positions), or None."""
    cfg = base_config(model)
    return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def model_device(model) -> torch.device:
    return next(model.parameters()).device


UNEMBED_ROWS = (1, 2, 4, 8, 16, 32, 64)  # rows at which the output projection is timed (once per model)
_UNEMBED_CURVES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {(threads, device): s[]}


class Forward:
    """One target call. Either ``logits`` [b, s, V] (a plain causal LM, or a base whose logits
    are not the plain output projection) or, for a lazy call, ``hidden`` [b, s, H], the final
    hidden states, from which the output projection and the heads run only where asked for."""

    def __init__(self, model, out=None, hidden=None, num_heads: int | None = None, unembed=None):
        self.model, self.out, self.hidden = model, out, hidden
        self.unembed = unembed if unembed is not None else getattr(model, "unembed", None)
        self.lazy = hidden is not None
        self.logits = None if self.lazy else out.logits
        self.num_heads = num_heads
        self.project_all = False  # lazy calls: project every node at the first argmax (set by the verifier)

    def argmax_at(self, rows, nodes) -> np.ndarray:
        """The base model's greedy token after node ``nodes[j]`` of row ``rows[j]``: int64[m].

        Lazy calls project either every node in one matmul at the first call (``project_all``)
        or only the nodes the walk visits, one small matmul per level; the verifier picks the
        cheaper from the measured projection cost and the walk's measured depth."""
        if self.lazy and self.logits is None and self.project_all:
            b, n, H = self.hidden.shape
            self.logits = self.unembed(self.hidden.reshape(-1, H)).view(b, n, -1)
        src = self.logits if self.logits is not None else self.hidden
        r = torch.as_tensor(rows, dtype=torch.long, device=src.device)
        n = torch.as_tensor(nodes, dtype=torch.long, device=src.device)
        if self.logits is None:
            return self.unembed(self.hidden[r, n]).argmax(dim=-1).cpu().numpy()
        return self.logits[r, n].argmax(dim=-1).cpu().numpy()

    def logits_at(self, rows, nodes) -> torch.Tensor:
        """The base model's logits after node ``nodes[j]`` of row ``rows[j]``: [m, V]."""
        src = self.logits if self.logits is not None else self.hidden
        r = torch.as_tensor(rows, dtype=torch.long, device=src.device)
        n = torch.as_tensor(nodes, dtype=torch.long, device=src.device)
        return src[r, n] if self.logits is not None else self.unembed(self.hidden[r, n])

    def draft_heads_at(self, nodes: torch.Tensor, vocab: "DraftVocab | None" = None) -> torch.Tensor:
        """The extra heads' logits (heads 1..num_heads-1, what the next lattice is built from)
        at node ``nodes[i]`` of row i: [b, h-1, V'] (V' = ``len(vocab)`` when a reduced draft
        vocabulary is given, else V; [b, 0, V] for a model without heads). The base model's
        own head is not projected here: its argmax at that node is the walk's bonus token."""
        if self.lazy:  # position-wise heads: run them on the b selected final hidden states only
            hid = self.hidden[torch.arange(len(nodes), device=self.hidden.device), nodes.to(self.hidden.device)]
            extra = 0 if not hasattr(self.model, "draft_logits") else (
                self.model.num_heads if self.num_heads is None else self.num_heads) - 1
            if extra <= 0:  # the base model's head only (no drafting heads)
                return hid.new_zeros(len(nodes), 0, len(vocab) if vocab is not None else
                                     hf.model_vocab_size(getattr(self.model, "base", self.model)))
            return self.model.draft_logits(hid, extra, None if vocab is None else vocab.ids)
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


def forward(model, input_ids, attention_mask, position_ids, cache, lazy: bool = False,
            num_heads: int | None = None) -> Forward:
    """One target call; works for a BlockwiseModel (Stern heads) and for a plain HF causal LM.
    Heads are computed afterwards only at the nodes asked for (``Forward.draft_heads_at``; the first
    ``num_heads``, default all). With ``lazy`` only the decoder backbone runs (no output
    projection, no hidden-state recording): a tree of N nodes pays the projection only for the
    nodes the accept walk visits, and the call costs what a plain decoder call costs."""
    kw = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
              past_key_values=cache, use_cache=True)
    if lazy:
        out = hf.backbone(model.base)(**kw)
        return Forward(model, hidden=out.last_hidden_state, num_heads=num_heads)
    if hasattr(model, "head_logits_from"):
        kw["heads"] = False
    return Forward(model, out=model(**kw), num_heads=num_heads)


def _walk(trees, argmax_at) -> tuple[list[list[int]], np.ndarray]:
    """Accept walk over all rows at once, level by level: at each level one ``argmax_at``
    call for the rows still matching (at most depth + 1 calls). Same result as
    ``tree.accept_path`` per row. Returns (node paths from the root, bonus tokens)."""
    b = len(trees)
    paths = [[0] for _ in range(b)]
    bonus = np.zeros(b, dtype=np.int64)
    live = list(range(b))
    while live:
        am = argmax_at(live, [paths[i][-1] for i in live])
        stop = np.zeros(len(live), dtype=bool)
        if isinstance(am, tuple):  # (tokens, stop): a chooser ending the walk at a token that is a child
            am, stop = am
        nxt = []
        for i, a, end in zip(live, np.asarray(am).tolist(), np.asarray(stop).tolist()):
            child = None if end else trees[i].children[paths[i][-1]].get(a)
            if child is None:
                bonus[i] = a
            else:
                paths[i].append(child)
                nxt.append(i)
        live = nxt
    return paths, bonus


def prefix_of(tree, node: int) -> tuple:
    """The draft tokens from the root (excluded) down to ``node`` of a ``DraftTree``."""
    out = []
    while node > 0:
        out.append(int(tree.tokens[node]))
        node = int(tree.parent[node])
    return tuple(reversed(out))


def node_of(tree, prefix) -> int:
    """The node of ``tree`` reached by the draft tokens ``prefix`` from the root."""
    node = 0
    for t in prefix:
        node = tree.children[node][int(t)]
    return node


def _walk_batched(seq: np.ndarray, logits: torch.Tensor, choose) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_walk`` with ``choose`` over drafts laid out as batch rows: seq int64[b, p, 1 + d]
    (root, draft, -1 after its end), logits [b, p, 1 + d, V]. The drafts of a row become a
    trie; trie node -> (the first draft holding that prefix, position). Returns the draft whose
    prefix was accepted, the accepted length and the chosen bonus token, each int64[b]."""
    b, p, _ = seq.shape
    trees = [build_tree(int(seq[i, 0, 0]), seq[i, :, 1:]) for i in range(b)]
    where = []
    for i, t in enumerate(trees):
        at = {0: (0, 0)}
        for j in range(p):
            node = 0
            for k, tok in enumerate(seq[i, j, 1:].tolist(), start=1):
                if tok < 0:
                    break
                node = t.children[node][tok]
                at.setdefault(node, (j, k))
        where.append(at)

    def at(rows, nodes):
        jk = [where[r][k] for r, k in zip(rows, nodes)]
        return logits[torch.as_tensor(rows), torch.as_tensor([j for j, _ in jk]), torch.as_tensor([k for _, k in jk])]

    def pick(rows, nodes):
        return choose(rows, at(rows, nodes), [prefix_of(trees[r], k) for r, k in zip(rows, nodes)],
                      lambda rs, pres: at(rs, [node_of(trees[r], pre) for r, pre in zip(rs, pres)]))

    paths, bonus = _walk(trees, pick)
    best = np.asarray([where[i][path[-1]][0] for i, path in enumerate(paths)], dtype=np.int64)
    nacc = np.asarray([len(path) - 1 for path in paths], dtype=np.int64)
    return best, nacc, bonus


@dataclass
class StepResult:
    """accepted: per row, the accepted draft tokens (int64[n_i]); bonus: int64[b], the target's
    token after them (the next step's root); head_logits: [b, h-1, V'] of the extra heads at the
    last accepted node (columns = ``Verifier.draft_vocab.ids`` when a draft vocabulary is set);
    side_argmax: per row, the target's argmax at the side branch's wanted nodes (int64[w_i];
    None without side branches)."""

    accepted: list
    bonus: np.ndarray
    head_logits: torch.Tensor
    side_argmax: list | None = None


class Verifier:
    """Prefill and verify for one target model; owns no state beyond the mode and the number of
    heads computed (``num_heads``: the base model's head plus ``num_heads - 1`` extra; default all)
    and the optional reduced vocabulary the extra heads project onto (``draft_vocab``: token ids).

    >>> v = Verifier(model)          # doctest: +SKIP
    >>> state, roots, heads = v.prefill([np.array([5, 6, 7]), np.array([8])])
    >>> res = v.verify(state, roots, [drafts_row0, drafts_row1])
    """

    def __init__(self, model, mode: str = "auto", num_heads: int | None = None, draft_vocab=None,
                 kv_cache: str = "auto", from_layer: int = 0):
        if getattr(model, "kind", None) == "dynamo":
            raise ModelError("BPD verification runs Stern heads; a DynaMo model decodes with --method dynamo")
        self.model = model
        self.window = sliding_window(model)
        self.split = None
        self.unembed = getattr(model, "unembed", None)
        if from_layer:  # split mode: layers from_layer..d over states the proposer computed
            from latticedraft.gpu.models.adapter import check_exit_layer
            from latticedraft.gpu.verify.layer_split import LayerSplit

            self.split = LayerSplit(model)
            check_exit_layer(self.split, from_layer, "the split verifier's first layer")
            self.from_layer, self.unembed = int(from_layer), self.split.head
            self.mode, self.mode_reason = "split", (f"layers {from_layer}..{self.split.num_layers} over the "
                                                    f"proposer's layer-{from_layer} states")
            self.rolling = choose_kv_cache(self.window, "batched", "full" if kv_cache == "auto" else kv_cache)
            self.lazy = True
        else:
            self.mode, self.mode_reason = choose_mode(model, mode)
            self.rolling = choose_kv_cache(self.window, self.mode, kv_cache)
            self.lazy = self.mode == "tree" and lazy_logits_ok(model)
        total = int(getattr(model, "num_heads", 1))
        if num_heads is not None and num_heads < 1:
            raise InputError(f"num_heads = {num_heads}: verification needs at least the base model's head")
        self.num_heads = None if num_heads is None or num_heads >= total else int(num_heads)
        self.dtype = model_dtype(model)
        self.device = model_device(model)
        self.draft_vocab = None if draft_vocab is None else DraftVocab(model, draft_vocab)
        self.draft_vocab_size = None if self.draft_vocab is None else len(self.draft_vocab)
        self.levels = 1.0  # running mean of the accept walk's levels (accepted drafts + 1) per row
        self.position_limit = position_limit(model)
        self.peak_cache_bytes = 0  # the largest KV cache seen right after a forward (in-flight nodes included)

    # -- prefill -------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompts: list[np.ndarray], choose=None, stem=None) -> tuple[SlotCache, np.ndarray, torch.Tensor]:
        """Run the left-padded prompts; returns the cache, the base model's greedy next token
        after each prompt (int64[b], the first root; ``choose(rows, logits, [()] * b, None)`` picks it
        instead when given, with empty prefixes) and the extra heads' logits there ([b, h-1, V'], as
        ``StepResult.head_logits``). Split mode: ``stem(ids, valid, pos, bias)`` runs the first
        layers (the proposer's) and returns their states [b, n, H], which the verifier continues."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise InputError("every prompt must have at least one token")
        b, n = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(b, n, dtype=torch.long, device=self.device)
        valid = torch.zeros(b, n, dtype=torch.bool, device=self.device)
        for i, p in enumerate(prompts):
            ids[i, n - len(p):] = torch.as_tensor(np.asarray(p, dtype=np.int64), device=self.device)
            valid[i, n - len(p):] = True
        pos = (torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
        if self.rolling:  # chunks of W into a rolling buffer; the last chunk's results give the roots
            state, out = chunked_prefill(self._run_tree, ids, valid, self.window)
            last = torch.full((b,), (n - 1) % self.window, dtype=torch.long)
            return (state, *self._prefill_result(out, last, choose, b))
        state = SlotCache.empty(b, self.device)
        if self.split is not None:
            if stem is None:
                raise InputError("split verification needs the proposer's stem (its first layers) at the prefill")
            allowed = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()[None] & valid[:, None, :]
            allowed = self._window(allowed, pos, pos)
            allowed |= torch.eye(n, dtype=torch.bool, device=self.device)[None]
            out = self._run_split(stem(ids, valid, pos, attention_bias(allowed, self.dtype)), allowed, pos, state)
            state.append_valid(valid, pos)
            return (state, *self._prefill_result(out, torch.full((b,), n - 1, dtype=torch.long), choose, b))
        if self.mode == "tree":
            causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            allowed = causal[None] & valid[:, None, :]
            allowed = self._window(allowed, pos, pos)
            allowed |= torch.eye(n, dtype=torch.bool, device=self.device)[None]  # padding rows: no NaN
            mask = attention_bias(allowed, self.dtype)
        else:
            mask = valid.long()
        out = forward(self.model, ids, mask, pos, state.cache, lazy=self.lazy, num_heads=self.num_heads)
        self._track(state)
        state.append_valid(valid, pos)
        last = torch.full((b,), n - 1, dtype=torch.long)
        return (state, *self._prefill_result(out, last, choose, b))

    def _prefill_result(self, out: "Forward", last: torch.Tensor, choose, b: int):
        if choose is None:
            roots = out.argmax_at(list(range(b)), last.tolist()).astype(np.int64)
        else:
            picked = choose(list(range(b)), out.logits_at(list(range(b)), last.tolist()), [()] * b, None)
            roots = np.asarray(picked[0] if isinstance(picked, tuple) else picked, dtype=np.int64)
        return roots, out.draft_heads_at(last, self.draft_vocab)

    def _run_tree(self, ids, allowed, pos, cache) -> "Forward":
        """One tree-mode call: ``allowed`` bool[b, N, K] becomes the additive 4-D mask."""
        out = forward(self.model, ids, attention_bias(allowed, self.dtype), pos, cache, lazy=self.lazy,
                      num_heads=self.num_heads)
        self.peak_cache_bytes = max(self.peak_cache_bytes, cache_bytes(cache))
        return out

    def _run_split(self, hidden, allowed, pos, state: SlotCache) -> "Forward":
        """Split mode: layers ``from_layer..d`` over ``hidden`` [b, N, H] under ``allowed`` bool[b, N, K]."""
        h = self.split.run(hidden, self.from_layer, self.split.num_layers, attention_bias(allowed, self.dtype), pos,
                           state.cache)
        self._track(state)
        return Forward(self.model, hidden=self.split.norm(h), num_heads=1, unembed=self.unembed)

    def unembed_seconds(self, rows: int) -> float:
        """Measured seconds of the output projection over ``rows`` hidden states. Timed once per
        model, thread count and device (a decode creates a verifier per call)."""
        curves = _UNEMBED_CURVES.setdefault(self.model, {})
        key = (torch.get_num_threads(), str(self.device))
        if key not in curves:
            H = int(base_config(self.model).hidden_size)
            times = []
            for r in UNEMBED_ROWS:
                x = torch.randn(r, H, dtype=self.dtype, device=self.device)
                self.unembed(x)
                t = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    self.unembed(x).argmax(dim=-1).cpu()
                    t.append(time.perf_counter() - t0)
                times.append(sorted(t)[2])
            curves[key] = np.maximum.accumulate(times)  # more rows never cost less (timing noise can say so)
        x, y = np.asarray(UNEMBED_ROWS, float), curves[key]
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])  # linear beyond the last measured size (>= 0)
        return float(np.interp(rows, x, y) if rows <= x[-1] else y[-1] + slope * (rows - x[-1]))

    def _track(self, state: SlotCache) -> None:
        self.peak_cache_bytes = max(self.peak_cache_bytes, state.nbytes())

    def _window(self, allowed, q_pos, k_pos):
        return window_mask(allowed, q_pos, k_pos, self.window)

    # -- verify --------------------------------------------------------------------------
    @torch.inference_mode()
    def verify(self, state: SlotCache, roots: np.ndarray, drafts: list[np.ndarray],
               sides: list[SideBranch] | None = None, heads=True, choose=None, hidden=None) -> StepResult:
        """Verify ``drafts[i]`` (int64[p_i, d_i]; negative = end of draft) after ``roots[i]``
        (the token already chosen, not yet in the cache) for every row i of ``state``;
        ``sides[i]``, if given, rides along and only its argmax comes back. heads: compute the
        extra heads at the accepted nodes (True), not (False: head_logits is [b, 0, V']), or
        ``heads(accepted, bonus) -> bool`` deciding once the walk is done. choose: None for
        greedy acceptance, else ``choose(rows, logits [m, V], prefixes, logits_at) -> int64[m]``, the
        token at each walked node given its draft prefix (sampling verification; see the module doc).
        hidden: split mode only, per row the states [1 + d_i, H] of [root, drafts[i][0]] at the first
        verified layer (each row's drafts one chain)."""
        if len(drafts) != state.batch or len(roots) != state.batch:
            raise InputError(f"{len(drafts)} draft sets and {len(roots)} roots for a batch of {state.batch}")
        if sides is not None and len(sides) != state.batch:
            raise InputError(f"{len(sides)} side branches for a batch of {state.batch}")
        if self.mode == "batched":
            return self._verify_batched(state, roots, drafts, sides, heads, choose)
        if (hidden is None) != (self.split is None):
            raise InputError("split verification takes the proposer's states (hidden=...), the other modes tokens")
        return self._verify_tree(state, roots, drafts, sides, heads, choose, hidden)

    def _heads(self, out: Forward, nodes: torch.Tensor, want, accepted, bonus) -> torch.Tensor:
        if callable(want):
            want = want(accepted, bonus)
        if want:
            return out.draft_heads_at(nodes, self.draft_vocab)
        cols = self.draft_vocab_size or hf.model_vocab_size(getattr(self.model, "base", self.model))
        return torch.zeros(len(nodes), 0, cols, dtype=self.dtype, device=self.device)

    def _clamp(self, q_pos: torch.Tensor) -> torch.Tensor:
        """Side nodes may look past the model's last position (GPT-2's learned positions): clamp.
        Accepted nodes never get there (the decode loops check prompt + max_new_tokens)."""
        return q_pos if self.position_limit is None else q_pos.clamp(max=int(self.position_limit) - 1)

    def _verify_tree(self, state, roots, drafts, sides=None, want_heads=True, choose=None, hidden=None) -> StepResult:
        trees = [build_tree(int(r), d) for r, d in zip(roots, drafts)]
        layouts = [step_layout(t, None if sides is None else sides[i]) for i, t in enumerate(trees)]
        packed = pack_trees(layouts)
        dev = self.device
        b, n = packed.tokens.shape
        start = state.length
        q_pos = self._clamp(state.next_pos[:, None] + torch.as_tensor(packed.depth, device=dev))
        anc = torch.as_tensor(packed.ancestors, device=dev)
        allowed = torch.cat([state.valid[:, None, :].expand(b, n, start), anc], dim=2)
        allowed = self._window(allowed, q_pos, torch.cat([state.pos, q_pos], dim=1))
        if hidden is not None:  # split mode: each row's chain of states, in layout order (root first)
            states = hidden[0].new_zeros(b, n, hidden[0].shape[-1])
            for i, h in enumerate(hidden):
                states[i, torch.as_tensor(layouts[i].tree_index[: len(h)], device=dev)] = h
            out = self._run_split(states, allowed, q_pos, state)
        else:
            out = forward(
                self.model, torch.as_tensor(packed.tokens, device=dev),
                attention_bias(allowed, self.dtype), q_pos, state.cache, lazy=self.lazy, num_heads=self.num_heads,
            )
            self._track(state)
        if self.lazy:  # one projection of all b * n nodes, or b rows per expected level (+ the side nodes)
            n_side = 0 if sides is None else sum(len(sd.wanted) for sd in sides)
            walk = self.levels * self.unembed_seconds(b) + (self.unembed_seconds(n_side) if n_side else 0.0)
            out.project_all = self.unembed_seconds(b * n) <= walk
        side_argmax = None
        if sides is not None:
            rows = [i for i, sd in enumerate(sides) for _ in range(len(sd.wanted))]
            nodes = [int(layouts[i].side_index[k]) for i, sd in enumerate(sides) for k in sd.wanted]
            flat = out.argmax_at(rows, nodes) if nodes else np.zeros(0, dtype=np.int64)
            ends = np.cumsum([0] + [len(sd.wanted) for sd in sides])
            side_argmax = [flat[ends[i]:ends[i + 1]].astype(np.int64) for i in range(b)]
        def pick(rows, nodes):
            at = [int(layouts[r].tree_index[k]) for r, k in zip(rows, nodes)]
            if choose is None:
                return out.argmax_at(rows, at)
            return choose(rows, out.logits_at(rows, at), [prefix_of(trees[r], k) for r, k in zip(rows, nodes)],
                          lambda rs, pres: out.logits_at(rs, [int(layouts[r].tree_index[node_of(trees[r], pre)])
                                                              for r, pre in zip(rs, pres)]))

        paths, bonus = _walk(trees, pick)
        self.levels = 0.8 * self.levels + 0.2 * float(np.mean([len(p) for p in paths]))
        m = max(len(p) for p in paths)
        keep = np.zeros((b, m), dtype=np.int64)
        keep_valid = np.zeros((b, m), dtype=bool)
        for i, p in enumerate(paths):
            keep[i, : len(p)] = layouts[i].tree_index[p]
            keep_valid[i, : len(p)] = True
        prefix = bool(keep_valid.all()) and bool((keep == np.arange(m)).all())
        state.commit(start, torch.as_tensor(keep, device=dev), torch.as_tensor(keep_valid, device=dev), prefix)
        last = torch.as_tensor(keep[np.arange(b), keep_valid.sum(axis=1) - 1], device=dev)  # layout index
        accepted = [t.tokens[p[1:]] for t, p in zip(trees, paths)]
        return StepResult(accepted, bonus, self._heads(out, last, want_heads, accepted, bonus), side_argmax)

    def _verify_batched(self, state, roots, drafts, sides=None, want_heads=True, choose=None) -> StepResult:
        """Rows i*q .. i*q+q-1 of the forward are row i's p drafts, then (with side branches)
        one row per wanted side node: the root and the side chain that node sees."""
        dev = self.device
        b = state.batch
        rows = [np.atleast_2d(np.asarray(d, dtype=np.int64)) for d in drafts]
        p = max(r.shape[0] for r in rows)
        chains = [[] for _ in range(b)] if sides is None else [
            [sd.tokens[sd.chain(int(k))] for k in sd.wanted] for sd in sides]
        w = max(len(c) for c in chains)
        d = max([r.shape[1] for r in rows] + [len(x) for c in chains for x in c])
        q = p + w
        seq = np.full((b, q, 1 + d), -1, dtype=np.int64)
        seq[:, :, 0] = np.asarray(roots, dtype=np.int64)[:, None]
        for i, r in enumerate(rows):
            r = np.concatenate([r, np.repeat(r[:1], p - r.shape[0], axis=0)]) if r.shape[0] < p else r
            seq[i, :p, 1 : 1 + r.shape[1]] = r
            for j, c in enumerate(chains[i]):
                seq[i, p + j, 1 : 1 + len(c)] = c
        for i in range(b):  # a negative token ends a draft: blank everything after it
            for j in range(q):
                neg = np.nonzero(seq[i, j] < 0)[0]
                if len(neg):
                    seq[i, j, neg[0]:] = -1
        start = state.length
        state.repeat_rows(q)
        flat = torch.as_tensor(seq.reshape(b * q, 1 + d), device=dev)
        live = flat >= 0
        mask = torch.cat([state.valid, torch.ones_like(live)], dim=1).long()
        q_pos = self._clamp(state.next_pos[:, None] + torch.arange(1 + d, device=dev)[None])
        out = forward(self.model, flat.clamp(min=0), mask, q_pos, state.cache, num_heads=self.num_heads)
        self._track(state)
        argmax_all = out.logits.argmax(dim=-1).view(b, q, 1 + d).cpu().numpy()
        side_argmax = None if sides is None else [
            np.asarray([argmax_all[i, p + j, len(c)] for j, c in enumerate(chains[i])], dtype=np.int64)
            for i in range(b)]
        argmax = argmax_all[:, :p]
        best = np.zeros(b, dtype=np.int64)
        nacc = np.zeros(b, dtype=np.int64)
        if choose is not None:
            best, nacc, sampled = _walk_batched(seq[:, :p], out.logits.view(b, q, 1 + d, -1), choose)
        for i in range(b if choose is None else 0):
            for j in range(p):
                k = 0
                while k < d and seq[i, j, 1 + k] >= 0 and seq[i, j, 1 + k] == argmax[i, j, k]:
                    k += 1
                if k > nacc[i]:
                    nacc[i], best[i] = k, j
        sel = torch.as_tensor(np.arange(b) * q + best, device=dev)
        state.select_rows(sel)
        m = int(nacc.max()) + 1
        keep = torch.arange(m, device=dev)[None].expand(b, m).contiguous()
        keep_valid = keep <= torch.as_tensor(nacc, device=dev)[:, None]
        state.commit(start, keep, keep_valid)
        state.left_align()
        bonus = argmax[np.arange(b), best, nacc] if choose is None else sampled
        nodes = torch.zeros(b * q, dtype=torch.long, device=dev)
        nodes[sel] = torch.as_tensor(nacc, device=dev)
        accepted = [seq[i, best[i], 1 : 1 + nacc[i]].copy() for i in range(b)]
        bonus = bonus.astype(np.int64)
        heads = self._heads(out, nodes, want_heads, accepted, bonus)
        return StepResult(accepted, bonus, heads[sel] if heads.shape[1] else heads[:b], side_argmax)
