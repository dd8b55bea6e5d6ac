"""``bpd_decode``: one BPD decode on the one loop, composed of proposers (the heads' lattice
drafter or a draft model, the draft sources of ``decoding/sources.py``, a lookahead window +
pool), a verifier and a draft-tree planner (``methods/bpd.py`` is the registry entry that calls it
with what the session loaded).
"""

from __future__ import annotations

from dataclasses import dataclass

from latticedraft.decoding.registry import Request


@dataclass(frozen=True)
class BpdPlan:
    """How a BPD decode drafts beside its drafter and which nodes it verifies.

    tree: "fixed" (every drafted path) | "auto" (the nodes that maximise expected tokens per
    second under the step cost ``cost``: measured and cached for this model and batch where None;
    "fixed" where the verifier runs in batched mode and no ``cost`` is given,
    ``methods.bpd.BATCHED_TREE``); acceptance: calibrated rates (None: the prior); gate: a
    ``HeadGate`` (auto tree with a source that matches context, ``match(i, history)``, and heads;
    None: a new one); sources: the draft sources' ``Proposer``s whose paths join the tree
    (``decoding/sources.py``: ``ContextProposer(ContextNgrams(3))``, ...); lookahead:
    ``LookaheadOptions`` of a window + pool riding along;
    draft_vocab: token ids the extra heads project onto (None: all); kv_cache: "auto" | "full" |
    "rolling"; correction: a ``planning.acceptance.RateCorrection`` the auto tree corrects the
    rates with and teaches as it runs (None: the rates as fitted); note(line): hears of a cached
    step-cost curve that was not used (``learned_state.read``; the session's ``learned.event``)."""

    tree: str = "fixed"
    acceptance: object = None
    cost: object = None
    gate: object = None
    sources: tuple = ()
    lookahead: object = None
    draft_vocab: object = None
    kv_cache: str = "auto"
    correction: object = None
    note: object = None


def bpd_decode(model, prompts: list, drafter=None, plan: BpdPlan | None = None, request: Request | None = None, *,
               rule=None):
    """Decode ``prompts`` with BPD on the one loop.

    drafter: a lattice ``Drafter`` (``proposers.heads.make_drafter``; spawned per row), any
    ``Proposer`` (``ModelProposer``, ``MtadProposer``...) or None (no head drafts: without
    context n-grams the greedy loop); plan: ``BpdPlan`` (default: the fixed tree, nothing beside
    the drafter); request: ``registry.Request`` (budget, end ids, ``verify`` mode, rows and
    ``first_row``, streaming, ``in_flight`` for a continuous batch of head and context drafts,
    on_done; ``sampling`` for lossless sampling, whose noise a ``rule`` may bring:
    ``accept.sampling.SpeculativeRule(sampling, noise)``)."""
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.decoding.planning.draft_tree import TreePlanner
    from latticedraft.decoding.planning.head_gate import GatedHeads, HeadGate
    from latticedraft.decoding.proposers.base import Proposer
    from latticedraft.decoding.proposers.heads import HeadProposer
    from latticedraft.decoding.proposers.lookahead import LookaheadProposer
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.verify.verifier import Verifier

    plan = BpdPlan() if plan is None else plan
    req = Request() if request is None else request
    tree, lookahead, cost = plan.tree, plan.lookahead, plan.cost
    source = None if drafter is None else drafter if isinstance(drafter, Proposer) else HeadProposer(drafter)
    from_heads = source is not None and source.uses_heads
    proposers = ([source] if source is not None else []) + list(plan.sources)
    ctx = next((p for p in plan.sources if hasattr(p, "match")), None)  # what the head gate buckets steps by
    if lookahead is not None:
        proposers.append(LookaheadProposer(lookahead, hf.model_vocab_size(getattr(model, "base", model))))
    num_heads = getattr(source, "heads_needed", None) if from_heads else 1
    verifier = Verifier.for_model(model, req.verify, num_heads=num_heads,
                                  draft_vocab=plan.draft_vocab if from_heads else None, kv_cache=plan.kv_cache)
    if verifier.mode == "batched" and cost is None:  # T(n) of a tree does not model it (BATCHED_TREE)
        tree = "fixed"
    policy = tree if from_heads or source is None else "fixed"
    if policy == "auto" and cost is None:
        rows = len(prompts) if req.in_flight is None else min(req.in_flight, len(prompts))
        cost = verifier.step_costs(rows, note=plan.note)
    planner = TreePlanner(policy, plan.acceptance, cost, correction=plan.correction)
    gated = GatedHeads(plan.gate or HeadGate(), ctx) if tree == "auto" and ctx is not None and from_heads else None
    return speculative_decode(verifier, prompts, proposers, req, rule=rule, planner=planner, gate=gated)
