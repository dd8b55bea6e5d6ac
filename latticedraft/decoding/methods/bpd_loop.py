"""``bpd_decode``: one BPD decode on the one loop, composed of proposers (the heads' lattice
drafter or a draft model, context n-grams, the n-gram LM's continuation, the extra ``SOURCES``, a
lookahead window + pool), a verifier and a draft-tree planner (``methods/bpd.py`` is the registry
entry that calls it with what the session loaded).
"""

from __future__ import annotations

from latticedraft.decoding.registry import Request
from latticedraft.errors import InputError


def bpd_decode(model, prompts: list, drafter=None, *, max_new_tokens: int = 64, eos_token_id=None,
               verify: str = "auto", tree: str = "fixed", context=None, acceptance=None, draft_vocab=None,
               cost=None, gate=None, lookahead=None, sampling=None, draws=None, rule=None, kv_cache: str = "auto",
               first_row: int = 0, rows: list | None = None, on_tokens=None, record_steps: bool = False,
               slots: int | None = None, on_done=None, lm=None, extra=()):
    """Decode ``prompts`` with BPD on the one loop.

    drafter: a lattice ``Drafter`` (``proposers.heads.make_drafter``; spawned per row), any
    ``Proposer`` (``ModelProposer``, ``MtadProposer``...) or None (no head drafts: with
    ``context`` None the greedy loop). tree: "fixed" | "auto" (needs the cost model: measured
    and cached for this model and batch unless ``cost`` is given; without ``cost`` "fixed" where
    the verifier runs in batched mode, ``methods.bpd.BATCHED_TREE``; ``acceptance``: calibrated
    rates, default the prior); context: ``ContextNgrams`` or None; lm: (``LMNgrams``, ``LMArrays``)
    for the n-gram LM's continuation as one more path, or None; gate: a ``HeadGate`` (auto
    tree with context n-grams and heads; default a new one); draft_vocab: token ids the extra
    heads project onto; lookahead: ``LookaheadOptions`` of a window + pool riding along;
    sampling / draws / rule: lossless sampling (``loop.speculative_decode``); first_row: the
    index of prompts[0] in the caller's prompt list (per-row state and seeds; ``rows`` gives
    each prompt's run-wide id instead); slots: a continuous batch of that many rows
    (``loop.speculative_decode``; head and context drafts only); on_done(i, result): as each row
    finishes; extra: more ``Proposer``s whose paths join the tree (``methods.bpd.SOURCES``)."""
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.decoding.planning.draft_tree import TreePlanner
    from latticedraft.decoding.planning.head_gate import GatedHeads, HeadGate
    from latticedraft.decoding.proposers.base import Proposer
    from latticedraft.decoding.proposers.context import ContextProposer
    from latticedraft.decoding.proposers.heads import HeadProposer
    from latticedraft.decoding.proposers.lookahead import LookaheadProposer
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.verify.cost_model import CostModel
    from latticedraft.gpu.verify.verifier import Verifier

    if sampling is not None and (tree != "fixed" or context is not None or lookahead is not None or lm is not None
                                 or extra):
        raise InputError("lossless sampling verifies the drafted paths as drawn: use tree='fixed' without "
                         "context n-grams, LM drafts, a lookahead pool or other draft sources")
    source = None if drafter is None else drafter if isinstance(drafter, Proposer) else HeadProposer(drafter)
    from_heads = source is not None and source.uses_heads
    proposers = [source] if source is not None else []
    ctx = ContextProposer(context) if context is not None else None
    if ctx is not None:
        proposers.append(ctx)
    if lm is not None:
        from latticedraft.decoding.proposers.lm_ngrams import LMProposer

        proposers.append(LMProposer(*lm))
    proposers.extend(extra)
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
    if rule is None and sampling is not None and draws is not None:
        from latticedraft.decoding.accept.sampling import SpeculativeRule

        rule = SpeculativeRule(sampling, draws)
    req = Request(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, sampling=sampling,
                  rows=rows, first_row=first_row, on_tokens=on_tokens, record_steps=record_steps, slots=slots,
                  on_done=on_done)
    return speculative_decode(verifier, prompts, proposers, req, rule=rule, planner=planner, gate=gated)
