"""Verify drafts against the target model in one forward per step: the one verifier of every decoder.

Three modes, chosen by ``modes.choose_mode`` (or the split verifier's first layer) and reported
in every result:

- ``"tree"``: the p drafts of each row are merged into a prefix trie (``tree.py``) and run
  as one sequence of N nodes under a 4-D attention mask ``[b, 1, N, L + N]`` (each node sees
  the valid cache slots and its own ancestors, and for Mistral-style models only keys inside
  the sliding window: ``key_pos > query_pos - window``) at per-node positions ``next_pos +
  depth``.
- ``"split"`` (``from_layer = l``): the same trees, but layers ``l..d`` only, over the states at
  layer l that the proposer computed for [root, drafts] (Kangaroo's early layers + adapter); the
  proposer runs the first l layers of the prompt too (its ``stem``, at the prefill).
- ``"batched"``: the fallback for models whose attention takes no custom 4-D mask (flash
  attention, mixed sliding/full layers): every draft is a batch row ``[root, draft...]`` over a
  copy of the row's cache (the same ``kv.KVCache``, shown to the model as transformers'
  ``DynamicCache``), with a 2-D padding mask.

Tree and split verification run the model's layers through ``lean.LeanStack`` where it writes
them out (GPT-2, LLaMA, Mistral: no per-call wrappers, rotary tables built once, keys and values
written in place into the preallocated ``kv.KVCache``), else through transformers' forward
(``forward.hf_forward``) writing into the same cache.

Each row accepts the longest draft prefix equal to the target's argmax plus one bonus token
(the argmax after it); the cache keeps exactly the accepted nodes (``commit``: nothing moves when
the accepted path is the written prefix) and the extra heads' logits at the last accepted node
come back for the next step's lattice (predicting and verifying share one call, Stern et al.).
The output projection runs only at the nodes the walk visits (or every node at once, whichever
the measured projection cost makes cheaper), and greedy acceptance computes only its argmax
(``screened_argmax``: on CPUs with bfloat16 dot products, screened in bfloat16 under a proven
error bound and settled in float32).

With ``choose`` (an acceptance rule's, ``decoding/accept/``) the walk asks ``choose(rows, logits
[m, V], prefixes, logits_at)`` for the token at each walked node instead of the argmax
(``prefixes[j]``: the draft tokens from the root to that node; ``logits_at(rows, prefixes) -> [m,
V]`` the target's logits at any other node of the same trees, for rules that look down a path,
such as MTAD's): a returned child is accepted and the walk goes on, any other token is the
bonus (a rule may return ``(tokens, stop bool[m])`` to make a child token the bonus where
``stop``). The prefill's first token comes from it too (prefixes all empty). The verifier itself
stays free of any algorithm.

Sliding-window models in tree mode keep a rolling buffer by default (``kv_cache``, see
``modes.choose_kv_cache``): W slots per layer, position p in slot p mod W, prompts prefilled in
chunks of W (``prefill.py``); masks are built from slot positions.

A step may carry a *side branch* per row (``side_branch.py``: lookahead decoding's Jacobi
window): nodes run in the same forward with their own visibility, never accepted, whose argmax
is returned in ``StepResult.side_argmax``. In tree mode they sit between the root and the tree
(Figure 2(b) of Fu et al. 2024); the batched fallback runs each wanted side node's chain as one
more batch row.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf
from latticedraft.gpu.verify import lean
from latticedraft.gpu.verify.forward import DraftVocab, Forward, hf_forward, lazy_logits_ok
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.verify.modes import (base_config, check_verifiable, choose_kv_cache, choose_mode, model_device,
                                           model_dtype, position_limit, sliding_window)
from latticedraft.gpu.masks import CAUSAL, attention_bias, causal, causal_only, visible
from latticedraft.gpu.verify.prefill import chunked_prefill
from latticedraft.gpu.verify.screened_argmax import argmax_projection, median_seconds
from latticedraft.gpu.verify.screened_topk import topk_projection
from latticedraft.gpu.verify.side_branch import SideBranch, step_layout
from latticedraft.gpu.verify.split_cache import left_pad
from latticedraft.gpu.verify.tree import build_tree, main_path, pack_trees
from latticedraft.gpu.verify.tree_call import TreeCall
from latticedraft.gpu.verify.walk import draft_positions
from latticedraft.memo import kept, memo_of, weights_key


UNEMBED_ROWS = (1, 2, 4, 8, 16, 32, 64)  # rows at which the output projection is timed (once per model)
# the parts of a verify call (``Verifier.timing``): the trees, layouts and masks; the layers; the
# output projection and argmax at the walked nodes; the walk itself; keeping the accepted nodes
# in the cache; the extra heads at the accepted node
STEP_PARTS = ("tree", "forward", "project", "walk", "cache", "heads")


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
    """Prefill and verify for one target model, with a mode, the number of heads computed
    (``num_heads``: the base model's head plus ``num_heads - 1`` extra; default all) and the
    optional reduced vocabulary the extra heads project onto (``draft_vocab``: token ids). It
    outlives decodes: ``for_model`` keeps one per model and settings, with what it measured (the
    output projection's cost, which paths the walk takes); ``begin`` starts a decode's tallies.
    The decode state (the KV cache) is the caller's (``new_state``, ``prefill``).

    >>> v = Verifier.for_model(model)          # doctest: +SKIP
    >>> state, roots, heads = v.prefill([np.array([5, 6, 7]), np.array([8])])
    >>> res = v.verify(state, roots, [drafts_row0, drafts_row1])
    """

    @classmethod
    def for_model(cls, model, mode: str = "auto", num_heads: int | None = None, draft_vocab=None,
                  kv_cache: str = "auto", from_layer: int = 0) -> "Verifier":
        """The model's verifier for these settings, made once per weights and kept on the model
        (``memo.kept``); the arguments are ``Verifier``'s."""
        vocab = None if draft_vocab is None else np.asarray(draft_vocab, dtype=np.int64)
        slot = ("verifier", mode, num_heads, None if vocab is None else vocab.tobytes(), kv_cache, int(from_layer))
        return kept(model, "verify", slot, weights_key(model),
                    lambda: cls(model, mode, num_heads, vocab, kv_cache, from_layer))

    def __init__(self, model, mode: str = "auto", num_heads: int | None = None, draft_vocab=None,
                 kv_cache: str = "auto", from_layer: int = 0):
        check_verifiable(model)
        self.model = model
        self.window = sliding_window(model)
        self.num_layers = int(base_config(model).num_hidden_layers)
        self.from_layer = int(from_layer)
        heads_ok = not hasattr(model, "num_heads") or lazy_logits_ok(model)  # no heads, or position-wise ones
        why = lean.supports(model)
        if from_layer:  # split mode: layers from_layer..d over states the proposer computed
            from latticedraft.gpu.models.adapter import check_exit_layer

            if why is not None:
                raise ModelError(f"split verification (from layer {from_layer}) runs GPT-2, LLaMA and Mistral layers; "
                                 f"this model: {why}")
            self.stack = lean.stack_for(model)
            check_exit_layer(self.stack.split, from_layer, "the split verifier's first layer")
            self.mode, self.mode_reason = "split", (f"layers {from_layer}..{self.num_layers} over the proposer's "
                                                    f"layer-{from_layer} states")
            self.rolling = choose_kv_cache(self.window, "batched", "full" if kv_cache == "auto" else kv_cache)
        else:
            self.mode, self.mode_reason = choose_mode(model, mode)
            self.rolling = choose_kv_cache(self.window, self.mode, kv_cache)
            self.stack = lean.stack_for(model) if self.mode == "tree" and why is None and heads_ok else None
        self.lazy = self.stack is not None or (self.mode == "tree" and lazy_logits_ok(model))
        self.unembed = self.stack.unembed if self.stack is not None else getattr(model, "unembed", None)
        total = int(getattr(model, "num_heads", 1))
        if num_heads is not None and num_heads < 1:
            raise InputError(f"num_heads = {num_heads}: verification needs at least the base model's head")
        self.num_heads = None if num_heads is None or num_heads >= total else int(num_heads)
        if self.mode == "split":
            self.num_heads = 1
        self.dtype = model_dtype(model)
        self.device = model_device(model)
        self.draft_vocab = None if draft_vocab is None else DraftVocab(model, draft_vocab)
        self.draft_vocab_size = None if self.draft_vocab is None else len(self.draft_vocab)
        self.sample_states = None  # final states of the first prefill's prompt (<= 64): what projections are timed on
        self.off_path = 1.0  # running mean of the projections the accept walk adds to the main paths'  one
        self.position_limit = position_limit(model)
        self.begin()

    def step_costs(self, rows: int, note=None):
        """This verifier's ``cost_model.StepCosts`` at ``rows`` rows: T(n) from the stored or newly
        measured curve (``CostModel.for_batch``; ``note`` hears of a stored one not used), made once
        and refined by every decode that plans with it."""
        from latticedraft.gpu.verify.cost_model import CostModel, StepCosts

        costs = memo_of(self, "step_costs")
        if rows not in costs:
            costs[rows] = StepCosts(CostModel.for_batch(self, rows, note))
        return costs[rows]

    def begin(self) -> None:
        """Start a decode's tallies: ``peak_cache_bytes``, the largest KV cache seen right after a
        forward (in-flight nodes included), and ``timing``, seconds per part of every verify call."""
        self.peak_cache_bytes = 0
        self.timing = dict.fromkeys(STEP_PARTS, 0.0)

    def new_state(self, batch: int):
        """An empty ``KVCache`` for ``batch`` rows (of the verified layers; a rolling buffer where chosen)."""
        return KVCache(batch, self.num_layers - self.from_layer, self.device,
                       window=self.window if self.rolling else None, first_layer=self.from_layer)

    # -- one forward ----------------------------------------------------------------------
    def _run(self, x: torch.Tensor, allowed: np.ndarray, pos: torch.Tensor, state) -> Forward:
        """One tree/split forward over n nodes: x int64[b, n] tokens (or, split mode, states
        [b, n, H]); allowed bool[b, n, K + n] (numpy: who may attend to which cached slot and node)."""
        state.reserve(x.shape[1])
        if self.stack is None:
            bias = attention_bias(allowed, self.dtype, self.device)
            out = hf_forward(self.model, x, bias, pos, state.cache, lazy=self.lazy, num_heads=self.num_heads)
        else:
            mask = None if allowed.all() else CAUSAL if causal_only(allowed) else \
                torch.from_numpy(allowed).to(self.device)[:, None]
            h = x if x.dtype.is_floating_point else self.stack.embed(x, pos)
            h = self.stack.run(h, self.from_layer, self.num_layers, mask, pos, state)
            out = Forward(self.model, hidden=self.stack.norm(h), num_heads=self.num_heads, unembed=self.unembed)
        self._track(state)
        return out

    def _track(self, state) -> None:
        self.peak_cache_bytes = max(self.peak_cache_bytes, state.nbytes())

    def _clamp(self, q_pos):
        """Side nodes may look past the model's last position (GPT-2's learned positions): clamp.
        Accepted nodes never get there (the decode loops check prompt + max_new_tokens)."""
        if self.position_limit is None:
            return q_pos
        top = int(self.position_limit) - 1
        return q_pos.clamp(max=top) if isinstance(q_pos, torch.Tensor) else np.minimum(q_pos, top)

    # -- prefill -------------------------------------------------------------------------
    @torch.inference_mode()
    def prompt_call(self, prompts: list[np.ndarray], stem=None, reads="argmax") -> tuple[KVCache, TreeCall]:
        """Run the left-padded prompts into a new cache; returns it and the call whose one-node
        trees (each prompt's last token) acceptance picks the first token from (``TreeCall.walk``:
        the bonus of an empty tree). reads: as ``forward``. Split mode: ``stem(ids, valid, pos,
        bias)`` runs the first layers (the proposer's) and returns their states [b, n, H], which the
        verifier continues."""
        ids, valid, pos = left_pad(prompts, self.device)
        b, n = ids.shape
        state = self.new_state(b)
        if self.rolling:  # chunks of W into a rolling buffer; the last chunk's results give the roots
            out = chunked_prefill(lambda x, allowed, p: self._run(x, allowed, p, state), state, ids, valid, self.window)
            last = torch.full((b,), (n - 1) % self.window, dtype=torch.long)
        else:
            out = self._prompt_forward(state, ids, valid, pos, stem)
            state.append_valid(valid, pos)
            last = torch.full((b,), n - 1, dtype=torch.long)
        if self.sample_states is None and out.lazy:  # real final states to time projections on
            end = int(last[0]) + 1
            self.sample_states = out.hidden[0, max(0, end - max(UNEMBED_ROWS)):end].clone()
        if out.lazy:
            out.top_k = reads if isinstance(reads, int) else None
        at = last.tolist()
        trees = [build_tree(-1, np.zeros((1, 0), dtype=np.int64)) for _ in range(b)]
        return state, TreeCall(trees, out, lambda r, k: (r, at[r]), None, 0, last=last, t_done=time.perf_counter())

    def _prompt_forward(self, state, ids, valid, pos, stem) -> Forward:
        b, n = ids.shape
        if self.mode == "batched":
            state.reserve(n)
            out = hf_forward(self.model, ids, valid.long(), pos, state.transformers_cache(), lazy=self.lazy,
                             num_heads=self.num_heads)
            self._track(state)
            return out
        none = np.zeros((b, 0), dtype=bool)
        # no cache yet; a prompt's tokens see the earlier ones, padding rows see themselves
        allowed = visible(none, none.astype(np.int64), pos.cpu().numpy(), causal(valid.cpu().numpy()), self.window)
        x = ids
        if self.mode == "split":
            if stem is None:
                raise InputError("split verification needs the proposer's stem (its first layers) at the prefill")
            x = stem(ids, valid, pos, attention_bias(allowed, self.dtype, self.device))
        return self._run(x, allowed, pos, state)

    @torch.inference_mode()
    def prompt_heads(self, call: TreeCall, first: np.ndarray, heads: bool = True) -> torch.Tensor:
        """The extra heads' logits after each prompt ([b, h-1, V'], as ``StepResult.head_logits``;
        [b, 0, V'] with ``heads`` False: not computed), given the first token after it."""
        if not heads:
            return self._no_heads(len(first))
        return call.out.draft_heads_at(call.last, self.draft_vocab, next_tokens=np.asarray(first, dtype=np.int64))

    @torch.inference_mode()
    def prefill(self, prompts: list[np.ndarray], stem=None, heads: bool = True):
        """``prompt_call`` with the greedy first token: (the cache, the base model's greedy next token
        after each prompt int64[b], the extra heads' logits there)."""
        state, call = self.prompt_call(prompts, stem)
        _, first = call.walk()
        return state, first, self.prompt_heads(call, first, heads)

    def unembed_seconds(self, rows: int, reads="argmax") -> float:
        """Measured seconds of the output projection over ``rows`` hidden states, as a walk
        ``reads`` it: ``"argmax"`` its argmax (``ArgmaxProjection``), ``"logits"`` the logits
        themselves, an int k what a top-k of k reads (``TopKProjection``). Timed once per model,
        thread count and device (kept on the model: its verifiers share them)."""
        curves = memo_of(self.model, "verify").setdefault("unembed_curves", {})
        key = (torch.get_num_threads(), str(self.device), reads)
        if key not in curves:
            H = int(base_config(self.model).hidden_size)
            states = self.sample_states
            if states is None:
                states = torch.randn(max(UNEMBED_ROWS), H, generator=torch.Generator().manual_seed(0))
                states = states.to(dtype=self.dtype, device=self.device)
            if reads == "logits":
                project = lambda x: self.unembed(x).argmax(dim=-1).cpu()  # noqa: E731
            else:
                project = argmax_projection(self.unembed) if reads == "argmax" else topk_projection(self.unembed, reads)
                project.calibrate(states)
            times = [median_seconds(project, states[torch.arange(r) % len(states)]) for r in UNEMBED_ROWS]
            curves[key] = np.maximum.accumulate(times)  # more rows never cost less (timing noise can say so)
        x, y = np.asarray(UNEMBED_ROWS, float), curves[key]
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])  # linear beyond the last measured size (>= 0)
        return float(np.interp(rows, x, y) if rows <= x[-1] else y[-1] + slope * (rows - x[-1]))

    # -- verify: forward, then (acceptance, outside), commit -----------------------------
    @torch.inference_mode()
    def forward(self, state, roots: np.ndarray, drafts: list[np.ndarray], sides: list[SideBranch] | None = None,
                hidden=None, reads="argmax") -> TreeCall:
        """One target call over ``drafts[i]`` (int64[p_i, d_i]; negative = end of draft) after
        ``roots[i]`` (the token already chosen, not yet in the cache) for every row i of ``state``;
        ``sides[i]``, if given, rides along (its argmax comes back in the call). reads: what the
        acceptance will read at the walked nodes, "argmax" | "logits" | k (a top-k's reads), which
        sets how the output projection is run. hidden: split mode only, per row the states [1 + d_i,
        H] of [root, drafts[i][0]] at the first verified layer (each row's drafts one chain)."""
        if len(drafts) != state.batch or len(roots) != state.batch:
            raise InputError(f"{len(drafts)} draft sets and {len(roots)} roots for a batch of {state.batch}")
        if sides is not None and len(sides) != state.batch:
            raise InputError(f"{len(sides)} side branches for a batch of {state.batch}")
        if self.mode == "batched":
            return self._forward_batched(state, roots, drafts, sides, reads)
        if (hidden is None) != (self.mode != "split"):
            raise InputError("split verification takes the proposer's states (hidden=...), the other modes tokens")
        return self._forward_tree(state, roots, drafts, sides, hidden, reads)

    @torch.inference_mode()
    def commit(self, state, call: TreeCall, paths: list[list[int]], bonus: np.ndarray, heads=True) -> StepResult:
        """Keep each row's accepted node path (``TreeCall.walk``) in the cache and compute the extra
        heads at its last node: True, False (head_logits [b, 0, V']) or ``heads(accepted, bonus) ->
        bool`` deciding now."""
        t0 = time.perf_counter()
        out, tm = call.out, self.timing
        tm["project"] += out.seconds
        tm["walk"] += t0 - call.t_done - out.seconds
        if self.lazy and not out.project_all:
            self.off_path = 0.8 * self.off_path + 0.2 * (out.projections - 1)
        accepted, bonus = call.accepted(paths), np.asarray(bonus, dtype=np.int64)
        commit = self._commit_batched if call.batched else self._commit_tree
        nodes = commit(state, call, paths)
        t1 = time.perf_counter()
        head_logits = self._heads(out, nodes, heads, accepted, bonus)
        if call.batched:
            head_logits = head_logits[call.batched[2]] if head_logits.shape[1] else head_logits[: len(paths)]
        tm["cache"] += t1 - t0
        tm["heads"] += time.perf_counter() - t1
        return StepResult(accepted, bonus, head_logits, call.side_argmax)

    @torch.inference_mode()
    def verify(self, state, roots: np.ndarray, drafts: list[np.ndarray], sides: list[SideBranch] | None = None,
               heads=True, hidden=None) -> StepResult:
        """``forward``, the greedy walk and ``commit``: one greedy step, for callers without an
        acceptance rule of their own (the cost model's timed steps, tests)."""
        call = self.forward(state, roots, drafts, sides, hidden)
        paths, bonus = call.walk()
        return self.commit(state, call, paths, bonus, heads)

    def _heads(self, out: Forward, nodes: torch.Tensor, want, accepted, bonus) -> torch.Tensor:
        if callable(want):
            want = want(accepted, bonus)
        if want:  # token-input heads read the bonus (in the batched fallback, one node per forward row)
            nxt = bonus if len(bonus) == len(nodes) else None
            return out.draft_heads_at(nodes, self.draft_vocab, next_tokens=nxt)
        return self._no_heads(len(nodes))

    def _no_heads(self, b: int) -> torch.Tensor:
        """The head logits of a call that computed none: [b, 0, V']."""
        cols = self.draft_vocab_size or hf.model_vocab_size(getattr(self.model, "base", self.model))
        return torch.zeros(b, 0, cols, dtype=self.dtype, device=self.device)

    def _forward_tree(self, state, roots, drafts, sides, hidden, reads) -> TreeCall:
        """Tree and split modes: every row's layout (root, side nodes, tree) packed into one forward."""
        tm, t0 = self.timing, time.perf_counter()
        trees = [build_tree(int(r), d) for r, d in zip(roots, drafts)]
        layouts = [step_layout(t, None if sides is None else sides[i]) for i, t in enumerate(trees)]
        packed = pack_trees(layouts)
        b, n = packed.tokens.shape
        start = state.length
        q_pos = self._clamp(state.next_pos[:, None] + packed.depth)
        allowed = visible(state.valid, state.pos, q_pos, packed.ancestors, self.window, self_visible=False)
        if hidden is not None:  # split mode: each row's chain of states, in layout order (root first)
            x = hidden[0].new_zeros(b, n, hidden[0].shape[-1])
            for i, h in enumerate(hidden):
                x[i, torch.as_tensor(layouts[i].tree_index[: len(h)], device=self.device)] = h
        else:
            x = torch.as_tensor(packed.tokens, device=self.device)
        t1 = time.perf_counter()
        out = self._run(x, allowed, torch.from_numpy(q_pos).to(self.device), state)
        tm["tree"] += t1 - t0
        tm["forward"] += time.perf_counter() - t1
        if self.lazy:
            self._plan_projection(out, trees, layouts, sides, reads, b, n)
        side_argmax = None
        if sides is not None:
            rows = [i for i, sd in enumerate(sides) for _ in range(len(sd.wanted))]
            nodes = [int(layouts[i].side_index[k]) for i, sd in enumerate(sides) for k in sd.wanted]
            flat = out.argmax_at(rows, nodes) if nodes else np.zeros(0, dtype=np.int64)
            ends = np.cumsum([0] + [len(sd.wanted) for sd in sides])
            side_argmax = [flat[ends[i]:ends[i + 1]].astype(np.int64) for i in range(b)]
        return TreeCall(trees, out, lambda r, k: (r, int(layouts[r].tree_index[k])), side_argmax, start,
                        layouts=layouts, t_done=time.perf_counter())

    def _plan_projection(self, out: Forward, trees, layouts, sides, reads, b: int, n: int) -> None:
        """How a lazy call projects: every row's root alone (n = 1) or all b * n nodes at once, or
        each row's main path first (+ the side nodes), whichever the measured projection cost and
        the walk's measured depth make cheaper."""
        out.top_k = reads if isinstance(reads, int) else None
        if n == 1:
            out.project_all = True
            return
        main = [main_path(t) for t in trees]
        rows = np.repeat(np.arange(b), [len(m) for m in main])
        nodes = np.concatenate([layouts[i].tree_index[m] for i, m in enumerate(main)])
        n_side = 0 if sides is None else sum(len(sd.wanted) for sd in sides)
        cost = functools.partial(self.unembed_seconds, reads=reads)
        out.project_all = cost(b * n) <= cost(len(nodes) + n_side) + self.off_path * cost(b)
        if not out.project_all:
            if sides is not None:
                rows = np.concatenate([rows, [i for i, sd in enumerate(sides) for _ in sd.wanted]]).astype(np.int64)
                nodes = np.concatenate([nodes, [int(layouts[i].side_index[k]) for i, sd in enumerate(sides)
                                                for k in sd.wanted]]).astype(np.int64)
            out.prefetch(rows, nodes, logits=reads != "argmax")

    def _commit_tree(self, state, call: TreeCall, paths) -> torch.Tensor:
        """Keep the accepted nodes (nothing moves when they are the written prefix); returns each
        row's last accepted node (layout index)."""
        b, m = len(paths), max(len(p) for p in paths)
        keep = np.zeros((b, m), dtype=np.int64)
        keep_valid = np.zeros((b, m), dtype=bool)
        for i, p in enumerate(paths):
            keep[i, : len(p)] = call.layouts[i].tree_index[p]
            keep_valid[i, : len(p)] = True
        prefix = bool(keep_valid.all()) and bool((keep == np.arange(m)).all())
        state.commit(call.start, keep, keep_valid, prefix)
        return torch.as_tensor(keep[np.arange(b), keep_valid.sum(axis=1) - 1], device=self.device)

    def _forward_batched(self, state, roots, drafts, sides, reads) -> TreeCall:
        """Rows i*q .. i*q+q-1 of the forward are row i's p drafts, then (with side branches)
        one row per wanted side node: the root and the side chain that node sees."""
        t0 = time.perf_counter()
        b = state.batch
        seq, p, chains = batched_rows(roots, drafts, sides)
        q, d = seq.shape[1], seq.shape[2] - 1
        state.left_align()  # the model's masks see slot order: after rows kept different counts or joined
        start = state.length
        if q > 1:  # one row per draft, each over a copy of its row's cache (q = 1: the cache itself)
            state.select_rows(np.repeat(np.arange(b), q))
        flat = torch.as_tensor(seq.reshape(b * q, 1 + d), device=self.device)
        mask = torch.from_numpy(np.concatenate([state.valid, np.ones((b * q, 1 + d), dtype=bool)], axis=1))
        q_pos = torch.from_numpy(self._clamp(state.next_pos[:, None] + np.arange(1 + d)[None]))
        state.reserve(1 + d)
        out = hf_forward(self.model, flat.clamp(min=0), mask.long().to(self.device), q_pos.to(self.device),
                         state.transformers_cache(), num_heads=self.num_heads)
        self._track(state)
        self.timing["forward"] += time.perf_counter() - t0
        side_argmax = None
        if sides is not None:
            argmax_all = out.logits.argmax(dim=-1).view(b, q, 1 + d).cpu().numpy()
            side_argmax = [np.asarray([argmax_all[i, p + j, len(c)] for j, c in enumerate(chains[i])], dtype=np.int64)
                           for i in range(b)]
        trees = [build_tree(int(seq[i, 0, 0]), seq[i, :p, 1:]) for i in range(b)]
        where = [draft_positions(t, seq[i, :p]) for i, t in enumerate(trees)]
        return TreeCall(trees, out, lambda r, k: (r * q + where[r][k][0], where[r][k][1]), side_argmax, start,
                        batched=(q, where, None), t_done=time.perf_counter())

    def _commit_batched(self, state, call: TreeCall, paths) -> torch.Tensor:
        """Keep each row's copy of the cache whose draft holds the accepted path, up to its end;
        returns the accepted node per forward row (the heads read the kept rows')."""
        q, where, _ = call.batched
        b = len(paths)
        best = np.asarray([where[i][path[-1]][0] for i, path in enumerate(paths)], dtype=np.int64)
        nacc = np.asarray([len(path) - 1 for path in paths], dtype=np.int64)
        rows = np.arange(b) * q + best  # the forward row of each row's kept draft
        if q > 1:
            state.select_rows(rows)
        state.commit_prefix(call.start, nacc + 1)
        sel = torch.as_tensor(rows, device=self.device)
        call.batched = (q, where, sel)
        nodes = torch.zeros(b * q, dtype=torch.long, device=self.device)
        nodes[sel] = torch.as_tensor(nacc, device=self.device)
        return nodes


def batched_rows(roots, drafts, sides) -> tuple[np.ndarray, int, list]:
    """The batched fallback's forward rows: seq int64[b, q, 1 + d] (per row its p drafts, each
    [root, draft..., -1 after its end], then one row per wanted side node), p, and the side chains."""
    b = len(drafts)
    rows = [np.atleast_2d(np.asarray(d, dtype=np.int64)) for d in drafts]
    p = max(r.shape[0] for r in rows)
    chains = [[] for _ in range(b)] if sides is None else [[sd.tokens[sd.chain(int(k))] for k in sd.wanted]
                                                            for sd in sides]
    w = max(len(c) for c in chains)
    d = max([r.shape[1] for r in rows] + [len(x) for c in chains for x in c])
    seq = np.full((b, p + w, 1 + d), -1, dtype=np.int64)
    seq[:, :, 0] = np.asarray(roots, dtype=np.int64)[:, None]
    for i, r in enumerate(rows):
        r = np.concatenate([r, np.repeat(r[:1], p - r.shape[0], axis=0)]) if r.shape[0] < p else r
        seq[i, :p, 1 : 1 + r.shape[1]] = r
        for j, c in enumerate(chains[i]):
            seq[i, p + j, 1 : 1 + len(c)] = c
    for i in range(b):  # a negative token ends a draft: blank everything after it
        for j in range(p + w):
            neg = np.nonzero(seq[i, j] < 0)[0]
            if len(neg):
                seq[i, j, neg[0]:] = -1
    return seq, p, chains
