"""The one decode loop: draft -> plan -> verify -> accept -> emit, for every decoder that verifies drafts.

Each step, for the rows still decoding (a batch; rows leave as they finish):

1. **draft**: every proposer (``proposers/``: the heads' lattice drafters, context n-grams, the
   n-gram LM's continuation, a lookahead window + pool, a draft model, MTAD's beams, Kangaroo's
   early layers) proposes paths after each row's root, reading the heads' logits the previous
   call computed where it wants;
2. **plan**: ``planning.draft_tree.TreePlanner`` merges a row's proposals into the paths to
   verify (every path, or the nodes that maximise expected tokens per second under the measured
   step cost), under lossless sampling too: there every token is the target's argmax under the
   run's Gumbel noise (``accept/sampling.py``), so drafts and plans never change the output;
3. **verify**: one target forward over every row's tree (``Verifier.forward``: a ``TreeCall``
   that projects logits only at the nodes asked for);
4. **accept**: the acceptance rule (``accept/``: greedy, lossless speculative sampling, MTAD's
   joint rule) walks the trees outside the verifier (``TreeCall.walk``); the verifier then keeps
   the accepted nodes in the cache and computes the heads at the last one for the next step
   (``Verifier.commit``; Stern et al.: predicting and verifying share the call) -- unless the
   head gate skips them for a step;
5. **emit**: each row emits the accepted tokens plus one bonus token (``rows.Rows`` cuts at EOS
   and the budget); the gate, the planner and the proposers learn what was kept.

Counting: the prefill call emits 1 token, each verify call the accepted drafts + 1. With no
proposer every step verifies the root alone: latticedraft's own greedy loop on the same forward,
the baseline of the algorithmic gain.

    >>> r = speculative_decode(model, [ids], [HeadProposer(Top1Drafter())], Request(max_new_tokens=64))  # doctest: +SKIP
    >>> r.sequences[0].tokens, r.block_efficiency
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from latticedraft.decoding.accept.rule import GreedyRule, reads
from latticedraft.decoding.planning.draft_tree import Plan, TreePlanner
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
    run = DecodeRun(verifier, prompts, list(proposers), Request() if request is None else request, rule, planner, gate)
    run.admit()
    while run.rows.live:
        t0 = time.perf_counter()
        step = run.step()
        planned = plan(run.planner, draft(run.proposers, step), step)
        choose = planned.choose(run.rule, step)
        t1 = time.perf_counter()
        call = run.verify(step, planned, choose)
        paths, bonus = accept(call, choose)
        res = run.commit(step, call, paths, bonus)
        t2 = time.perf_counter()
        run.timing["draft"] += t1 - t0
        run.timing["model"] += t2 - t1  # the verify call: forward, the walk's projections, the commit
        run.emit(step, planned, res, t2 - t1)
    return run.result()


@dataclass
class Planned:
    """One step's plan for every live row: by_row[j], row j's proposals (one per proposer);
    drafts[j] int64[p, d], the paths to verify; nodes[j], the tree's size with the root and any
    side branch; qs, sides, hidden: per row the first proposal's q (MTAD's rule reads it), side
    branch (lookahead's window) and layer-l states (split verification), None where none has one."""

    by_row: list
    drafts: list
    nodes: list
    qs: list
    sides: list
    hidden: list

    def choose(self, rule, step: Step):
        """The acceptance rule's ``choose`` for this step (None: greedy; ``accept/rule.py``)."""
        qs = self.qs if any(q is not None for q in self.qs) else None
        return rule.for_step(step.rows, self.drafts, qs, step.histories)


def draft(proposers: list, step: Step) -> list[list[Proposal]]:
    """Phase 1, draft: every proposer's proposals for the step's rows, by row: [row][proposer]."""
    props = [p.propose(step) for p in proposers] or [[Proposal.empty() for _ in step.rows]]
    return [[pp[j] for pp in props] for j in range(len(step.rows))]


def plan(planner: TreePlanner, by_row: list, step: Step) -> Planned:
    """Phase 2, plan: the paths each row verifies (``TreePlanner.plan_rows``), and what rides along."""
    plans: list[Plan] = planner.plan_rows(by_row, step.rooms)
    first = lambda mine, attr: next((getattr(x, attr) for x in mine if getattr(x, attr) is not None), None)  # noqa: E731
    sides = [first(mine, "side") for mine in by_row]
    nodes = [pl.nodes + (0 if sd is None else sd.size) for pl, sd in zip(plans, sides)]
    return Planned(by_row, [pl.drafts for pl in plans], nodes, [first(mine, "q") for mine in by_row], sides,
                   [first(mine, "hidden") for mine in by_row])


def accept(call, choose) -> tuple[list[list[int]], np.ndarray]:
    """Phase 4, accept: each row's accepted node path and bonus token, the rule's ``choose``
    walking the verify call's trees (``TreeCall.walk``; None: the target's argmax), outside the
    verifier."""
    return call.walk(choose)


class DecodeRun:
    """One ``speculative_decode`` call's running state: the rows (``rows.Rows``), the cache and the
    heads of the live rows, their roots (the token each step verifies after), the prompts still
    waiting, timings and step records; ``step``, ``verify`` and ``emit`` are the loop's phases
    that touch it, ``admit`` prefills waiting prompts into free rows."""

    def __init__(self, verifier, prompts: list, proposers: list, req: Request, rule, planner, gate):
        model = verifier.model if isinstance(verifier, Verifier) else verifier
        self.req, self.proposers, self.gate = req, proposers, gate
        self.prompts = checked_prompts(model, prompts, req.max_new_tokens)
        b = len(self.prompts)
        self.in_flight = _in_flight(req, b, proposers)
        self.index = list(range(req.first_row, req.first_row + b))
        self.row_ids = list(self.index) if req.rows is None else list(req.rows)
        self.uses_heads = any(p.uses_heads for p in proposers)
        self.rule = rule if rule is not None else _default_rule(req.sampling)
        if not isinstance(verifier, Verifier):
            verifier = Verifier.for_model(model, req.verify, num_heads=None if self.uses_heads else 1)
        self.verifier, self.planner = verifier, planner or TreePlanner("fixed")
        verifier.begin()
        self.vocab = None if verifier.draft_vocab is None else verifier.draft_vocab.ids
        self.samplers = _samplers(model, req.sampling, self.rule, self.row_ids)
        done_cb = None if req.on_done is None else (lambda i, seq: req.on_done(i, DecodeResult.one(
            seq, verifier.mode, verifier.mode_reason, verifier.peak_cache_bytes)))
        self.rows = Rows(self.prompts, req.max_new_tokens, req.eos_token_id, req.on_tokens, done_cb)
        self.rows.live = []  # (``admit`` starts them)
        self.timing = {"model": 0.0, "lattice": 0.0, "draft": 0.0, "accept": 0.0, "prefill": 0.0}
        self.records: list[StepRecord] = []
        for p in proposers:
            p.start(StepRows(self.index, self.row_ids, self.prompts))
        self.stem = next((p.stem for p in proposers if p.stem is not None), None)
        self.joins = all(p.admits for p in proposers)  # rows may join a running batch (and a starting one)
        self.waiting = list(range(b))  # prompts not started yet, in order
        self.state, self.heads, self.roots = None, None, []
        self.t_step, self.heads_paid, self.heads_now = time.perf_counter(), 0.0, 0.0  # seconds on heads

    # -- admitting prompts --------------------------------------------------------------------
    def admit(self) -> None:
        """Prefill waiting prompts into the free rows (until full, or none waits); rows that finish
        at their first token make room again. A batch that starts afresh (nothing was running)
        begins the gate again: its first step drafts from the prefill's heads where the gate's
        policy computes them."""
        fresh = not self.rows.live
        while self.waiting and len(self.rows.live) < self.in_flight:
            new = self.waiting[: self.in_flight - len(self.rows.live)]
            if self.joins:  # prompts of unlike lengths in separate calls (rows joining before the first step)
                new = new[: prefill_group([len(self.prompts[i]) for i in new])]
            del self.waiting[: len(new)]
            self._prefill(new)
        if fresh and self.gate is not None and self.rows.live:
            live = self.rows.live
            self.gate.begin([self.index[i] for i in live], [self.rows.history(i) for i in live], self.heads.shape[1] > 0)
        self.t_step = time.perf_counter()

    def _prefill(self, new: list[int]) -> None:
        """Prefill prompts ``new`` (positions in the call's list) and join them to the running batch."""
        t0 = time.perf_counter()
        ps = [self.prompts[i] for i in new]
        running = bool(self.rows.live)
        # heads for the first step: the gate's call where the batch starts afresh; rows joining a running
        # batch bring them where its next step has them
        want = self.gate.prefill_heads() if self.gate is not None and not running else (
            not running or self.heads.shape[1] > 0)
        choose = self.rule.for_step([self.row_ids[i] for i in new], None, None, ps)
        st, call = self.verifier.prompt_call(ps, stem=self.stem, reads=reads(choose))
        _, first = call.walk(choose)
        hd = self.verifier.prompt_heads(call, first, want)
        self.timing["prefill"] += time.perf_counter() - t0
        if not running:  # nothing running: the new rows are the batch
            self.state, self.heads, self.roots = st, hd, []
        else:
            self.state.append_rows(st)
            self.heads = torch.cat([self.heads, hd[:, : self.heads.shape[1]]])  # no heads this step: none for them
        old = len(self.rows.live)
        self.rows.admit(new)
        done = [False] * old + [self.rows.emit(i, [int(first[j])]) for j, i in enumerate(new)]
        keep = self.rows.finish(done)
        self.roots = [(self.roots + [int(x) for x in first])[j] for j in keep]
        self._keep(keep, len(done), self.heads)

    # -- the step's phases that touch the run ---------------------------------------------------
    def step(self) -> Step:
        """What proposers see of this step (``proposers.base.Step``)."""
        live, rows, pl = self.rows.live, self.rows, self.planner
        return Step(index=[self.index[i] for i in live], rows=[self.row_ids[i] for i in live],
                    histories=[rows.history(i) for i in live], rooms=[rows.room(i) for i in live],
                    head_logits=self.heads if self.uses_heads and self.heads.shape[1] > 0 else None, vocab=self.vocab,
                    samplers=None if self.samplers is None else [self.samplers[i] for i in live],
                    acceptance=pl.acceptance if pl.policy == "auto" else None, cache=self.state,
                    cost=pl.step_seconds if pl.policy == "auto" else None)

    def verify(self, step: Step, planned: Planned, choose):
        """Phase 3, verify: one target forward over every row's tree (``Verifier.forward``),
        reading at the walked nodes what the rule's ``choose`` reads."""
        hidden = planned.hidden if self.verifier.mode == "split" else None
        sides = planned.sides if any(s is not None for s in planned.sides) else None
        return self.verifier.forward(self.state, np.asarray(self.roots, dtype=np.int64), planned.drafts, sides,
                                     hidden=hidden, reads=reads(choose))

    def commit(self, step: Step, call, paths, bonus):
        """The end of the verify call: the cache keeps the accepted nodes, and the next step's heads
        are computed where they are wanted (``Verifier.commit``); a ``StepResult``."""
        h0 = self.verifier.timing["heads"]
        res = self.verifier.commit(self.state, call, paths, bonus, heads=self._want_heads(step))
        self.heads_now = self.verifier.timing["heads"] - h0  # this call's seconds on the extra heads
        return res

    def emit(self, step: Step, planned: Planned, res, verify_s: float) -> None:
        """Phase 5, emit: teach the gate, planner and proposers what was kept, emit each row's
        accepted tokens and bonus, drop finished rows and admit waiting prompts."""
        t0 = time.perf_counter()
        self._learn(step, max(planned.nodes), res, t0, verify_s)
        done = []
        for j, i in enumerate(self.rows.live):
            acc = [int(t) for t in res.accepted[j]]
            self.rows.step(i, len(acc), planned.nodes[j], int(any(x.heads for x in planned.by_row[j])))
            if self.req.record_steps:
                self.records.append(self._record(i, j, step, planned, acc, int(res.bonus[j])))
            done.append(self.rows.emit(i, acc + [int(res.bonus[j])]))
        keep = self.rows.finish(done)
        self.roots = [int(res.bonus[j]) for j in keep]
        self._keep(keep, len(done), res.head_logits)
        self.timing["accept"] += time.perf_counter() - t0
        self.admit()  # (its prefill is timed apart: no step's arm pays for it)

    @staticmethod
    def _record(i: int, j: int, step: Step, planned: Planned, acc: list, bonus: int) -> StepRecord:
        """Row ``i``'s (batch position ``j``) step: its lattice, verified paths, kept tokens and the
        lattice drafter's own first path (its rescored best where it rescores)."""
        lat = next((x for x in planned.by_row[j] if x.sausage is not None), None)
        best = lat.tokens[0][lat.tokens[0] >= 0] if lat is not None and len(lat.tokens) else None
        return StepRecord(i, step.histories[j], None if lat is None else lat.sausage, planned.drafts[j],
                          np.asarray(acc, dtype=np.int64), bonus, best)

    def _want_heads(self, step: Step):
        """What the commit computes heads for: the gate's decision on the next histories, or whether
        any proposer reads heads."""
        if self.gate is None:
            return self.uses_heads

        def want(accepted, bonus):
            nxt = [np.concatenate([h, np.asarray(a, dtype=np.int64), [int(x)]])
                   for h, a, x in zip(step.histories, accepted, bonus)]
            return self.gate.decide(step.index, nxt)

        return want

    def _learn(self, step: Step, nodes: int, res, now: float, verify_s: float) -> None:
        """The gate (this step's arm, tokens and seconds; the heads computed in this call serve the
        next step, those this step drafted from came with the last call), the planner (what every
        tree size pays: the step's time outside the verify call, and the heads inside it, which
        T(n) leaves out; this call's T(n) at its ``nodes`` per row; what each rated node was) and every
        proposer learn from the step."""
        h = self.heads_now
        if self.gate is not None:
            self.gate.observe(sum(len(a) + 1 for a in res.accepted), now - self.t_step - h + self.heads_paid)
            self.heads_paid = h
        self.planner.overhead = 0.8 * self.planner.overhead + 0.2 * max(now - self.t_step - verify_s + h, 0.0)
        self.planner.observe_cost(nodes, verify_s - h)
        self.planner.observe(res.accepted)
        for p in self.proposers:
            p.update(step, res.accepted, res.bonus, res.side_argmax)

    def _keep(self, keep: list[int], b: int, heads: torch.Tensor) -> None:
        """Rows at batch positions ``keep`` go on: the cache, the heads' logits and every proposer
        drop the others (nothing to do when all go on or none does)."""
        self.heads = heads
        if len(keep) == b or not keep:
            return
        self.state.select_rows(keep)
        for p in self.proposers:
            p.retire(keep)
        self.heads = heads[torch.as_tensor(keep, dtype=torch.long, device=heads.device)]

    def result(self) -> DecodeResult:
        lattice = sum(getattr(p, "lattice_seconds", 0.0) for p in self.proposers)
        t = self.timing
        t["lattice"], t["draft"] = lattice, t["draft"] - lattice
        t.update({f"verify.{k}": v for k, v in self.verifier.timing.items()})  # the verify calls' parts
        v = self.verifier
        return self.rows.result(v.mode, v.mode_reason, t, self.records, v.peak_cache_bytes)


def _in_flight(req: Request, b: int, proposers: list) -> int:
    """The most rows in flight (``Request.in_flight``, default all), checked against the proposers."""
    in_flight = b if req.in_flight is None else int(req.in_flight)
    if in_flight < 1:
        raise InputError(f"in_flight = {in_flight}: a batch needs at least one row")
    if in_flight < b and not all(p.admits for p in proposers):
        raise InputError("a continuous batch (in_flight < prompts) admits prompts into running rows, and "
                         + ", ".join(p.name for p in proposers if not p.admits)
                         + " keeps per-batch state; decode these in fixed batches")
    return in_flight


def _default_rule(sampling):
    """Greedy acceptance, or lossless sampling where ``sampling`` is set."""
    if sampling is None:
        return GreedyRule()
    from latticedraft.decoding.accept.sampling import SpeculativeRule

    return SpeculativeRule(sampling)


def _samplers(model, sampling, rule, row_ids: list) -> list | None:
    """Each row's view of the rule's noise for drafting under sampling (a rule without one: the seed's)."""
    if sampling is None:
        return None
    from latticedraft.decoding.accept.sampling import DraftSampler, GumbelNoise

    V = hf.model_vocab_size(getattr(model, "base", model))
    noise = getattr(rule, "noise", None) or GumbelNoise(sampling.seed)
    return [DraftSampler(sampling, noise, r, V) for r in row_ids]
