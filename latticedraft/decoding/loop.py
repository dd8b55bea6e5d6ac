"""The one decode loop: draft -> plan -> verify -> accept, for every decoder that verifies drafts.

Each step, for the rows still decoding (a batch; rows leave as they finish):

1. **draft**: every proposer (``proposers/``: the heads' lattice drafters, context n-grams, the
   n-gram LM's continuation, a lookahead window + pool, a draft model, MTAD's beams, Kangaroo's
   early layers) proposes paths after each row's root, reading the heads' logits the previous
   call computed where it wants;
2. **plan**: ``planning.draft_tree.TreePlanner`` merges a row's proposals into the paths to
   verify (every path, or the nodes that maximise expected tokens per second under the measured
   step cost), under lossless sampling too: there every token is the target's argmax under the
   run's Gumbel noise (``accept/sampling.py``), so drafts and plans never change the output;
3. **verify**: one target call over every row's tree (``gpu/verify/verifier.py``), which also
   computes the heads at the last accepted node for the next step (Stern et al.: predicting and
   verifying share the call) -- unless the head gate skips them for a step;
4. **accept**: the acceptance rule (``accept/``: greedy, lossless speculative sampling, MTAD's
   joint rule) walks the tree; each row emits the accepted tokens plus one bonus token
   (``rows.Rows`` cuts at EOS and the budget); proposers learn what was kept.

Counting: the prefill call emits 1 token, each verify call the accepted drafts + 1. With no
proposer every step verifies the root alone: latticedraft's own greedy loop on the same forward,
the baseline of the algorithmic gain.

    >>> r = speculative_decode(model, [ids], [HeadProposer(Top1Drafter())], Request(max_new_tokens=64))  # doctest: +SKIP
    >>> r.sequences[0].tokens, r.block_efficiency
"""

from __future__ import annotations

import time

import numpy as np
import torch

from latticedraft.decoding.accept.rule import GreedyRule
from latticedraft.decoding.planning.draft_tree import TreePlanner
from latticedraft.decoding.proposers.base import Proposal, Step, StepRows
from latticedraft.decoding.registry import Request
from latticedraft.decoding.results import DecodeResult, StepRecord
from latticedraft.decoding.rows import Rows
from latticedraft.decoding.runs.prompt_length import checked_prompts
from latticedraft.errors import InputError
from latticedraft.gpu.models import hf
from latticedraft.gpu.verify.verifier import Verifier

PAD_SHARE = 0.25  # prompts share a prefill call while its left padding adds at most this to their tokens


def prefill_group(lengths) -> int:
    """How many of the waiting prompts (their token lengths, in order) the next prefill call takes:
    as many as keep the call's left padding within ``PAD_SHARE`` of their own tokens, at least one.
    A long prompt beside short ones is prefilled alone instead of padding each short one to its
    length (then every row pays the long one's prefill, and attention needs a mask)."""
    k, top, total = 1, int(lengths[0]), int(lengths[0])
    while k < len(lengths):
        t, s = max(top, int(lengths[k])), total + int(lengths[k])
        if (k + 1) * t - s > PAD_SHARE * s:
            break
        k, top, total = k + 1, t, s
    return k


@torch.inference_mode()
def speculative_decode(verifier, prompts: list, proposers=(), request: Request | None = None, *, rule=None,
                       planner: TreePlanner | None = None, gate=None) -> DecodeResult:
    """Decode every prompt (int sequences, >= 1 token each) with ``proposers`` (a list; empty:
    latticedraft's greedy loop).

    verifier: a prepared ``Verifier`` (split verification for Kangaroo; a reduced draft
    vocabulary), or a model, for which one is built (``request.verify``; the extra heads computed
    where a proposer reads them). request: what is asked (``registry.Request``: max_new_tokens,
    eos_token_id, sampling, rows, on_tokens, record_steps, in_flight, on_done; default
    ``Request()``). rule: the acceptance rule (default ``GreedyRule``, or
    ``accept.sampling.SpeculativeRule(request.sampling)`` when sampling: lossless sampling; MTAD
    passes its own). planner: which nodes to verify (default every proposed path); gate: a
    ``planning.head_gate.GatedHeads`` that may skip the heads for a step. Rows are
    ``request.rows`` run-wide (seeds; default ``request.first_row`` + 0..b-1); proposers key their
    per-call state by ``first_row`` + the prompt's position in ``prompts``. on_tokens(i, new_ids)
    streams; on_done(i, result) is called as row i finishes, with a ``DecodeResult`` of that row
    alone; record_steps keeps a ``StepRecord`` per row and step.

    ``request.in_flight``: the most rows in flight (default all): a continuous batch. The first
    ``in_flight`` prompts start; whenever rows finish, the next prompts are prefilled on their own
    and join the running batch in the freed rows (``append_rows`` of the cache), so drafting rows that
    finish at different steps do not leave the batch running short until the slowest is done.
    Needs proposers whose per-row state is keyed by the prompt (``Proposer.admits``); with them,
    prompts of unlike lengths are also prefilled in separate calls (``prefill_group``)."""
    req = Request() if request is None else request
    model = verifier.model if isinstance(verifier, Verifier) else verifier
    max_new_tokens, sampling, on_tokens, on_done = req.max_new_tokens, req.sampling, req.on_tokens, req.on_done
    record_steps = req.record_steps
    prompts = checked_prompts(model, prompts, max_new_tokens)
    proposers = list(proposers)
    b = len(prompts)
    in_flight = b if req.in_flight is None else int(req.in_flight)
    if in_flight < 1:
        raise InputError(f"in_flight = {in_flight}: a batch needs at least one row")
    if in_flight < b and not all(p.admits for p in proposers):
        raise InputError("a continuous batch (in_flight < prompts) admits prompts into running rows, and "
                         + ", ".join(p.name for p in proposers if not p.admits)
                         + " keeps per-batch state; decode these in fixed batches")
    index = list(range(req.first_row, req.first_row + b))
    row_ids = list(index) if req.rows is None else list(req.rows)
    uses_heads = any(p.uses_heads for p in proposers)
    if rule is None:
        if sampling is None:
            rule = GreedyRule()
        else:
            from latticedraft.decoding.accept.sampling import SpeculativeRule

            rule = SpeculativeRule(sampling)
    if not isinstance(verifier, Verifier):
        verifier = Verifier.for_model(model, req.verify, num_heads=None if uses_heads else 1)
    verifier.begin()
    planner = planner or TreePlanner("fixed")
    vocab = None if verifier.draft_vocab is None else verifier.draft_vocab.ids
    samplers = None
    if sampling is not None:  # each row's view of the rule's noise (a rule without one: the seed's)
        from latticedraft.decoding.accept.sampling import DraftSampler, GumbelNoise

        V = hf.model_vocab_size(getattr(model, "base", model))
        noise = getattr(rule, "noise", None) or GumbelNoise(sampling.seed)
        samplers = [DraftSampler(sampling, noise, r, V) for r in row_ids]
    done_cb = None if on_done is None else (lambda i, seq: on_done(i, DecodeResult.one(
        seq, verifier.mode, verifier.mode_reason, verifier.peak_cache_bytes)))
    state_rows = Rows(prompts, max_new_tokens, req.eos_token_id, on_tokens, done_cb)
    timing = {"model": 0.0, "lattice": 0.0, "draft": 0.0, "accept": 0.0}
    steps: list[StepRecord] = []
    for p in proposers:
        p.start(StepRows(index, row_ids, prompts))
    stem = next((p.stem for p in proposers if p.stem is not None), None)

    timing["prefill"] = 0.0
    joins = all(p.admits for p in proposers)  # rows may join a running batch (and a starting one)
    waiting = list(range(b))  # prompts not started yet, in order
    state_rows.live = []  # (``admit`` starts them)
    state, heads, roots = None, None, []

    def admit():
        """Prefill waiting prompts into the free rows (until full, or none waits); rows that
        finish at their first token make room again. A batch that starts afresh (nothing was
        running) begins the gate again: its first step drafts from the prefill's heads where the
        gate's policy computes them."""
        nonlocal state, heads, roots
        fresh = not state_rows.live
        while waiting and len(state_rows.live) < in_flight:
            new = waiting[: in_flight - len(state_rows.live)]
            if joins:  # prompts of unlike lengths in separate calls (rows joining before the first step)
                new = new[: prefill_group([len(prompts[i]) for i in new])]
            del waiting[: len(new)]
            t0 = time.perf_counter()
            ps = [prompts[i] for i in new]
            # heads for the first step: the gate's call where the batch starts afresh; rows joining a
            # running batch bring them where its next step has them
            want = gate.prefill_heads() if gate is not None and not state_rows.live else (
                not state_rows.live or heads.shape[1] > 0)
            st, first, hd = verifier.prefill(ps, choose=rule.for_step([row_ids[i] for i in new], None, None, ps),
                                             stem=stem, heads=want)
            timing["prefill"] += time.perf_counter() - t0
            if not state_rows.live:  # nothing running: the new rows are the batch
                state, heads, roots = st, hd, []
            else:
                state.append_rows(st)
                heads = torch.cat([heads, hd[:, : heads.shape[1]]])  # no heads this step: none for them either
            old = len(state_rows.live)
            state_rows.admit(new)
            done = [False] * old + [state_rows.emit(i, [int(first[j])]) for j, i in enumerate(new)]
            roots = roots + [int(x) for x in first]
            keep = state_rows.finish(done)
            roots = [roots[j] for j in keep]
            heads = _keep_rows(keep, len(done), state, heads, proposers)
        if fresh and gate is not None and state_rows.live:
            gate.begin([index[i] for i in state_rows.live], [state_rows.history(i) for i in state_rows.live],
                       heads.shape[1] > 0)

    admit()

    t_step = time.perf_counter()
    heads_paid = 0.0  # seconds the last verify call spent on the heads this step drafts from
    while state_rows.live:
        live = state_rows.live
        step = Step(index=[index[i] for i in live], rows=[row_ids[i] for i in live],
                    histories=[state_rows.history(i) for i in live], rooms=[state_rows.room(i) for i in live],
                    head_logits=heads if uses_heads and heads.shape[1] > 0 else None, vocab=vocab,
                    samplers=None if samplers is None else [samplers[i] for i in live],
                    acceptance=planner.acceptance if planner.policy == "auto" else None, cache=state,
                    cost=planner.step_seconds if planner.policy == "auto" else None)
        t0 = time.perf_counter()
        props = [p.propose(step) for p in proposers] or [[Proposal.empty() for _ in live]]
        by_row = [[pp[j] for pp in props] for j in range(len(live))]
        drafts, qs, sides, hidden, nodes = [], [], [], [], []
        plans = planner.plan_rows(by_row, step.rooms)
        for j, mine in enumerate(by_row):
            drafts.append(plans[j].drafts)
            nodes.append(plans[j].nodes)
            qs.append(next((x.q for x in mine if x.q is not None), None))  # (MTAD's rule reads its q)
            sides.append(next((x.side for x in mine if x.side is not None), None))
            hidden.append(next((x.hidden for x in mine if x.hidden is not None), None))
            if sides[-1] is not None:
                nodes[-1] += sides[-1].size
        timing["draft"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        choose = rule.for_step(step.rows, drafts, qs if any(q is not None for q in qs) else None, step.histories)

        def want_heads(accepted, bonus, step=step):
            nxt = [np.concatenate([h, np.asarray(a, dtype=np.int64), [int(x)]])
                   for h, a, x in zip(step.histories, accepted, bonus)]
            return gate.decide(step.index, nxt)

        h0 = verifier.timing["heads"]
        res = verifier.verify(state, np.asarray(roots, dtype=np.int64), drafts,
                              sides if any(s is not None for s in sides) else None,
                              heads=want_heads if gate is not None else uses_heads, choose=choose,
                              hidden=hidden if verifier.mode == "split" else None)
        t1 = time.perf_counter()
        timing["model"] += t1 - t0
        h = verifier.timing["heads"] - h0  # this verify call's seconds on the extra heads
        if gate is not None:  # this step's arm, tokens and wall-clock time; the heads computed in this
            # call serve the next step (its arm), those this step drafted from came with the last call
            gate.observe(sum(len(a) + 1 for a in res.accepted), t1 - t_step - h + heads_paid)
            heads_paid = h
        # what every tree size pays: the step's time outside the verify call (drafting, bookkeeping)
        # and the heads inside it (the cost model's T(n) leaves them out)
        planner.overhead = 0.8 * planner.overhead + 0.2 * max(t1 - t_step - (t1 - t0) + h, 0.0)
        planner.observe(res.accepted)
        for p in proposers:
            p.update(step, res.accepted, res.bonus, res.side_argmax)
        done = []
        for j, i in enumerate(live):
            acc = [int(t) for t in res.accepted[j]]
            state_rows.step(i, len(acc), nodes[j], int(any(x.heads for x in by_row[j])))
            if record_steps:
                lat = next((x for x in by_row[j] if x.sausage is not None), None)
                best = lat.tokens[0][lat.tokens[0] >= 0] if lat is not None and len(lat.tokens) else None
                steps.append(StepRecord(i, step.histories[j], None if lat is None else lat.sausage, drafts[j],
                                        np.asarray(acc, dtype=np.int64), int(res.bonus[j]), best))
            done.append(state_rows.emit(i, acc + [int(res.bonus[j])]))
        keep = state_rows.finish(done)
        roots = [int(res.bonus[j]) for j in keep]
        heads = _keep_rows(keep, len(live), state, res.head_logits, proposers)
        timing["accept"] += time.perf_counter() - t1
        admit()  # (its prefill is timed apart: no step's arm pays for it)
        t_step = time.perf_counter()
    lattice = sum(getattr(p, "lattice_seconds", 0.0) for p in proposers)
    timing["lattice"], timing["draft"] = lattice, timing["draft"] - lattice
    timing.update({f"verify.{k}": v for k, v in verifier.timing.items()})  # the verify calls' parts
    return state_rows.result(verifier.mode, verifier.mode_reason, timing, steps, verifier.peak_cache_bytes)


def _keep_rows(keep: list[int], b: int, state, heads: torch.Tensor, proposers) -> torch.Tensor:
    """Rows at batch positions ``keep`` go on: the cache, the heads' logits and every proposer
    drop the others (nothing to do when all go on or none does)."""
    if len(keep) == b or not keep:
        return heads
    state.select_rows(keep)
    for p in proposers:
        p.retire(keep)
    return heads[torch.as_tensor(keep, dtype=torch.long, device=heads.device)]
