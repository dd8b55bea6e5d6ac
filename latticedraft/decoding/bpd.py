"""Blockwise parallel decoding (``--method bpd``): the heads' drafts on the one decode loop.

A BPD decode composes proposers for ``loop.speculative_decode``: the heads' lattice drafter
(``proposers/heads.py``: top1, neural, ngram, parallel, parallel-base, oracle) or an auxiliary
draft model (``--drafter model``), plus, optionally, context n-grams (prompt lookup), the n-gram
LM's most likely continuation (``--lm-drafts``) and a lookahead window + pool; the draft tree is
fixed (every path) or cost-aware (``--tree auto``), with the head gate where context n-grams can
carry a step alone. With ``sampling`` the drafter draws its paths and the loop accepts by lossless
speculative sampling (no tree choice, context or LM n-grams or pool: choices that look at the
drawn tokens would bias them).

``DrafterSpec`` holds the drafting options as plain values (CLI flags map 1:1); ``METHOD`` is the
registry entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from latticedraft.decoding.loop import speculative_decode
from latticedraft.decoding.registry import Method
from latticedraft.errors import InputError

AUTO_DRAFT_VOCAB = 1024  # V' of the bundled heads: 80% of corpus tokens, projection 8x cheaper
AUTO_LM_DRAFTS = 3  # tokens of the n-gram LM's continuation: deeper ones measured slower (docs/speed.md)
FAST = {"tree": "auto", "context_ngrams": 3, "draft_vocab": "auto", "lm_drafts": "auto"}  # fastest in benchmarks/decode.py
# Heads drafted from when sampling and --slots is not given: a drawn path is accepted token by token
# with probability sum(min(p, q)) (~0.45 per token at T = 1 with the bundled heads), so a token at
# depth 4 is reached on ~4% of steps while every drafted slot costs a head, a draw and a tree node
# each step (benchmarks/sampling.py: the same tokens per call with 3 slots as with 7, docs/sampling.md)
SAMPLED_SLOTS = 3
DRAFTERS = ("top1", "neural", "ngram", "parallel", "parallel-base", "oracle", "model", "none")
HEAD_DRAFTERS = ("top1", "neural", "ngram", "parallel", "parallel-base", "oracle")
# which drafters read a drafting option (the others are refused it)
DRAFTER_OPTIONS = {
    "rescorer": ("neural",), "alpha": ("ngram", "parallel", "neural"),
    "nbest": ("parallel", "parallel-base"), "draft_model": ("model",), "gamma": ("model",),
    **{d: HEAD_DRAFTERS for d in ("k", "prune", "eps", "backoff", "slots", "draft_vocab")},
}
LOOKAHEAD_POOL = ("window", "ngram", "pool", "prompt_as_reference", "lookahead_config")
# why batched verification runs the fixed tree: its step costs rows x depth, which T(n) of n tree nodes
# does not model, and measuring T(n) alone costs ~100 verify calls before the first token
BATCHED_TREE = ("batched verification runs every drafted path as a row over its own copy of the cache, so "
                "the cost-aware tree's T(n) does not model it; it verifies the fixed set of paths")


@dataclass
class DrafterSpec:
    """What the drafter and the draft tree need, as plain values.

    tree: "fixed" (verify every drafted path) or "auto" (cost-aware tree, ``planning/draft_tree.py``);
    context_ngrams: longest context suffix matched for extra draft paths (0: off);
    lm_drafts: tokens of the n-gram LM's greedy continuation drafted as one more path (0: off;
    "auto": ``AUTO_LM_DRAFTS`` where the LM build exists and fits the tokenizer, else off);
    draft_vocab: V', the number of most frequent tokens the heads project onto (None: all;
    "auto": ``AUTO_DRAFT_VOCAB`` where the heads ship ``draft_vocab.json``, else all).
    The defaults are the paper's drafters as published (the eval tables); ``fast()`` gives the
    fastest measured settings (benchmarks/decode.py), the CLI's and the demo's defaults."""

    name: str = "top1"
    k: int = 16
    prune: str = "none"
    eps: float = 0.001
    backoff: float | None = None
    slots: int | None = None
    alpha: float = 1.0
    nbest: int = 16
    tree: str = "fixed"
    context_ngrams: int = 0
    draft_vocab: int | str | None = None
    lookahead: object = None  # LookaheadOptions: a Jacobi window + n-gram pool as one more path source
    gamma: int = 4  # tokens the auxiliary draft model drafts per step (--drafter model)
    lm_drafts: int | str = 0

    def for_sampling(self) -> "DrafterSpec":
        """This drafter as lossless sampling verifies it: every drafted path as drawn, ``SAMPLED_SLOTS``
        deep unless ``slots`` says otherwise."""
        return replace(self, tree="fixed", context_ngrams=0, lookahead=None, lm_drafts=0,
                       slots=SAMPLED_SLOTS if self.slots is None else self.slots)

    def fast(self) -> "DrafterSpec":
        """This drafter with the fastest measured tree, context and vocabulary settings."""
        return replace(self, **FAST)

    def context(self):
        from latticedraft.decoding.proposers.context import ContextNgrams

        return ContextNgrams(max_ngram=self.context_ngrams) if self.context_ngrams else None

    def lattice_options(self):
        from latticedraft.decoding.proposers.heads import LatticeOptions

        return LatticeOptions(k=self.k, prune=self.prune, eps=self.eps, backoff=self.backoff, slots=self.slots)


def bpd_decode(model, prompts: list, drafter=None, *, max_new_tokens: int = 64, eos_token_id=None,
               verify: str = "auto", tree: str = "fixed", context=None, acceptance=None, draft_vocab=None,
               cost=None, gate=None, lookahead=None, sampling=None, draws=None, rule=None, kv_cache: str = "auto",
               first_row: int = 0, rows: list | None = None, on_tokens=None, record_steps: bool = False,
               slots: int | None = None, on_done=None, lm=None):
    """Decode ``prompts`` with BPD on the one loop.

    drafter: a lattice ``Drafter`` (``proposers.heads.make_drafter``; spawned per row), any
    ``Proposer`` (``ModelProposer``, ``MtadProposer``...) or None (no head drafts: with
    ``context`` None the greedy loop). tree: "fixed" | "auto" (needs the cost model: measured
    and cached for this model and batch unless ``cost`` is given; without ``cost`` "fixed" where
    the verifier runs in batched mode, ``BATCHED_TREE``; ``acceptance``: calibrated
    rates, default the prior); context: ``ContextNgrams`` or None; lm: (``LMNgrams``, ``LMArrays``)
    for the n-gram LM's continuation as one more path, or None; gate: a ``HeadGate`` (auto
    tree with context n-grams and heads; default a new one); draft_vocab: token ids the extra
    heads project onto; lookahead: ``LookaheadOptions`` of a window + pool riding along;
    sampling / draws / rule: lossless sampling (``loop.speculative_decode``); first_row: the
    index of prompts[0] in the caller's prompt list (per-row state and seeds; ``rows`` gives
    each prompt's run-wide id instead); slots: a continuous batch of that many rows
    (``loop.speculative_decode``; head and context drafts only); on_done(i, result): as each row
    finishes."""
    from latticedraft.decoding.planning.draft_tree import TreePlanner
    from latticedraft.decoding.planning.head_gate import GatedHeads, HeadGate
    from latticedraft.decoding.proposers.base import Proposer
    from latticedraft.decoding.proposers.context import ContextProposer
    from latticedraft.decoding.proposers.heads import HeadProposer
    from latticedraft.decoding.proposers.lookahead import LookaheadProposer
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.verify.cost_model import CostModel
    from latticedraft.gpu.verify.verifier import Verifier

    if sampling is not None and (tree != "fixed" or context is not None or lookahead is not None or lm is not None):
        raise InputError("lossless sampling verifies the drafted paths as drawn: use tree='fixed' without "
                         "context n-grams, LM drafts or a lookahead pool")
    source = None if drafter is None else drafter if isinstance(drafter, Proposer) else HeadProposer(drafter)
    from_heads = source is not None and source.uses_heads
    proposers = [source] if source is not None else []
    ctx = ContextProposer(context) if context is not None else None
    if ctx is not None:
        proposers.append(ctx)
    if lm is not None:
        from latticedraft.decoding.proposers.lm_ngrams import LMProposer

        proposers.append(LMProposer(*lm))
    if lookahead is not None:
        proposers.append(LookaheadProposer(lookahead, hf.model_vocab_size(getattr(model, "base", model))))
    num_heads = getattr(source, "heads_needed", None) if from_heads else 1
    verifier = Verifier(model, verify, num_heads=num_heads, draft_vocab=draft_vocab if from_heads else None,
                        kv_cache=kv_cache)
    if verifier.mode == "batched" and cost is None:  # T(n) of a tree does not model it (BATCHED_TREE)
        tree = "fixed"
    policy = tree if from_heads or source is None else "fixed"
    if policy == "auto" and cost is None:
        cost = CostModel.for_batch(verifier, len(prompts) if slots is None else min(slots, len(prompts)))
    planner = TreePlanner(policy, acceptance, cost)
    gated = GatedHeads(gate or HeadGate(), ctx) if tree == "auto" and ctx is not None and from_heads else None
    n = len(prompts)
    index = list(range(first_row, first_row + n))
    return speculative_decode(model, prompts, proposers, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                              rule=rule, sampling=sampling, draws=draws, planner=planner, gate=gated,
                              verifier=verifier, index=index, rows=index if rows is None else rows,
                              on_tokens=on_tokens, record_steps=record_steps, slots=slots, on_done=on_done)


# ---------------------------------------------------------------------------------------------- registry


def _configure(values: dict, given: set) -> DrafterSpec:
    from latticedraft.decoding.proposers.heads import LatticeOptions

    name = values.get("drafter") or "top1"
    if name not in DRAFTERS:
        raise InputError(f"--drafter {name!r} is not one of {', '.join(DRAFTERS)}")
    for dest, users in DRAFTER_OPTIONS.items():
        if dest in given and name not in users:
            raise InputError(f"--{dest.replace('_', '-')} does not apply to --drafter {name} (it applies to "
                             f"--drafter {' / '.join(users)}); drop it")
    lm_drafts = _lm_drafts(values.get("lm_drafts"))
    if "lm" in given and name not in ("ngram", "parallel") and not lm_drafts:
        raise InputError(f"--lm does not apply to --drafter {name} without --lm-drafts (it applies to --drafter "
                         "ngram / parallel and to LM drafts); drop it")
    pool = bool(values.get("lookahead_pool"))
    if not pool:
        for dest in LOOKAHEAD_POOL:
            if dest in given:
                raise InputError(f"--{dest.replace('_', '-')} does not apply to --method bpd unless --lookahead-pool "
                                 "runs a Jacobi window (or use --method lookahead); add --lookahead-pool or drop it")
    ctx = values.get("context_ngrams")
    ctx = 0 if ctx is None else ctx
    if ctx < 0:
        raise InputError(f"--context-ngrams {ctx}: give the longest suffix to match (>= 1), or 0 for off")
    vocab = values.get("draft_vocab")
    if vocab not in (None, "auto"):
        try:
            vocab = int(vocab)
        except ValueError:
            raise InputError(f"--draft-vocab {vocab!r}: give a number of tokens (0 = full vocabulary) or auto") from None
        if vocab < 0:
            raise InputError(f"--draft-vocab {vocab}: give a number of tokens >= 1, 0 for the full vocabulary, or auto")
        vocab = vocab or None
    look = None
    if pool:
        from latticedraft.decoding.proposers.lookahead import options_from

        look = options_from(values, given)
    pick = lambda k, d: d if values.get(k) is None else values[k]  # noqa: E731
    tree = pick("tree", "fixed")
    if values.get("verify") == "batched" and tree == "auto":
        if "tree" in given:
            raise InputError(f"--tree auto does not apply to --verify batched: {BATCHED_TREE}; drop --tree auto")
        tree = "fixed"
    spec = DrafterSpec(name=name, k=pick("k", 16), prune=pick("prune", "none"), eps=pick("eps", 0.001),
                       backoff=values.get("backoff"), slots=values.get("slots"), alpha=pick("alpha", 1.0),
                       nbest=pick("nbest", 16), tree=tree, context_ngrams=ctx, draft_vocab=vocab,
                       lookahead=look, gamma=pick("gamma", 4), lm_drafts=lm_drafts)
    if spec.name in HEAD_DRAFTERS:
        LatticeOptions(spec.k, spec.prune, spec.eps, spec.backoff, spec.slots)  # the lattice options' ranges
    if spec.nbest < 1:
        raise InputError(f"--nbest {spec.nbest} must be >= 1")
    if spec.gamma < 1:
        raise InputError(f"--gamma {spec.gamma}: the draft model drafts at least 1 token per step")
    if not (np.isfinite(spec.alpha) and spec.alpha >= 0):
        raise InputError(f"--alpha {spec.alpha} must be a finite number >= 0 (the weight of the rescoring LM)")
    if "eps" in given and spec.prune == "none":
        raise InputError("--eps applies to --prune static or otsu only; add --prune static or drop --eps")
    if spec.name == "model" and values.get("draft_model") is None:
        raise InputError("--drafter model needs an auxiliary draft model: pass --draft-model DIR (e.g. data/rescorer-medium)")
    if values.get("do_sample"):
        if spec.name == "oracle":
            raise InputError("--drafter oracle drafts the greedy output; it has nothing to offer sampling "
                             "(choose another drafter)")
        why = ("--do-sample verifies the drafted paths as drawn (no cost-aware tree, context n-grams, LM drafts "
               "or lookahead pool: choices that look at sampled tokens would bias them)")
        if pool:
            raise InputError(f"--lookahead-pool does not apply here: {why}; drop it")
        if "context_ngrams" in given and ctx:
            raise InputError(f"--context-ngrams {ctx} does not apply here: {why}; drop it")
        if "lm_drafts" in given and lm_drafts:
            raise InputError(f"--lm-drafts {lm_drafts} does not apply here: {why}; drop it")
        spec = spec.for_sampling()
    return spec


def _lm_drafts(value) -> int | str:
    """``--lm-drafts``: a number of tokens (0 = off) or "auto"."""
    if value is None or value == "auto":
        return 0 if value is None else "auto"
    try:
        depth = int(value)
    except (TypeError, ValueError):
        raise InputError(f"--lm-drafts {value!r}: give a number of tokens (0 = off) or auto") from None
    if depth < 0:
        raise InputError(f"--lm-drafts {depth}: give a number of tokens >= 1, 0 for off, or auto")
    return depth


def _label(spec: DrafterSpec, sampling) -> str:
    return f"bpd/{spec.name}" + sampling_label(sampling)


def sampling_label(sampling) -> str:
    """`` sampling T=.. top-k=.. top-p=.. seed=..`` (empty for greedy), for every method's label."""
    if sampling is None:
        return ""
    return (f" sampling T={sampling.temperature} top-k={sampling.top_k} top-p={sampling.top_p} seed={sampling.seed}"
            + ("" if sampling.repetition_penalty == 1.0 else f" rep={sampling.repetition_penalty}"))


def _settings(spec: DrafterSpec, sampling) -> dict:
    s = {"drafter" if k == "name" else k: v for k, v in asdict(spec).items()}
    return {**s, "sampling": None if sampling is None else asdict(sampling)}


def _check(session, spec: DrafterSpec) -> None:
    """Before any LM table, draft model, T(n) or acceptance rate: the verifier can run this model."""
    from latticedraft.gpu.verify.modes import check_verifiable

    check_verifiable(session.model)


def _prepare(session, spec: DrafterSpec, batch_size: int) -> None:
    session.prepare_drafter(spec, batch_size)


def _run(session, prompts: list, spec: DrafterSpec, req) -> object:
    refs = session.references(prompts, req.max_new_tokens) if spec.name == "oracle" else None  # what it drafts
    return bpd_decode(session.model, prompts, session.proposer(spec, refs), max_new_tokens=req.max_new_tokens,
                      eos_token_id=req.eos_token_id, verify=req.verify, tree=spec.tree, context=spec.context(),
                      acceptance=session.acceptance(spec) if spec.tree == "auto" else None,
                      draft_vocab=session.draft_vocab(spec.draft_vocab) if spec.name in HEAD_DRAFTERS else None,
                      gate=session.gate(spec), lookahead=spec.lookahead, sampling=req.sampling, rows=req.rows,
                      on_tokens=req.on_tokens, record_steps=req.record_steps, slots=req.slots,
                      on_done=req.on_done, lm=session.lm_drafts(spec))


METHOD = Method(
    name="bpd",
    summary="blockwise parallel decoding: the heads' lattice (rescored or not), a draft model, context n-grams "
            "and a lookahead pool, verified in one tree per step; lossless",
    lossless=True,
    sampling="optional",
    options=("drafter", "lm", "rescorer", "alpha", "nbest", "k", "prune", "eps", "backoff", "slots", "verify", "tree",
             "context_ngrams", "lm_drafts", "draft_vocab", "lookahead_pool", "draft_model", "gamma", *LOOKAHEAD_POOL),
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    check=_check,
    continuous=lambda spec: spec.name in ("none", *HEAD_DRAFTERS) and spec.lookahead is None,
    files=lambda spec: {"ngram": ("lm",), "parallel": ("lm",), "neural": ("rescorer",),
                        "model": ("draft_model",)}.get(spec.name, ()),
)
