"""The blockwise parallel decoding loop: predict -> draft -> verify -> accept (Algorithm 1).

One target call per step: the verify forward over the draft tree also yields the heads'
logits at the last accepted token, which form the next step's lattice (Stern et al. 2018).
Prompts of different lengths decode together; each row stops on EOS or ``max_new_tokens``
and leaves the batch. Output equals the target model's greedy decode token for token.

With ``sampling`` (``spec_sampling.SamplingOptions``) the loop samples losslessly instead: the
drafter draws its drafts (``Drafter.sample``: sampled paths with their q, or deterministic
paths as one-hot drafts), every drafted path is verified as drawn (no cost-aware pruning, no
context n-grams: a choice that looked at the sampled tokens would bias them) and the walk
accepts by multi-step speculative sampling; the output has the target's sampling distribution.

Counting: the prefill call emits 1 token (the base model's argmax); each verify call emits
the n accepted draft tokens plus one bonus token. Block efficiency = tokens / calls, so plain
greedy decoding has 1.0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from latticedraft.decoding.planning.acceptance import AcceptanceModel
from latticedraft.decoding.proposers.context import ContextNgrams
from latticedraft.decoding.planning.draft_tree import TreePlanner
from latticedraft.decoding.planning.head_gate import HeadGate
from latticedraft.decoding.runs.prompt_length import check_fits
from latticedraft.errors import InputError
from latticedraft.gpu.models import hf
from latticedraft.gpu.verify.cost_model import CostModel
from latticedraft.gpu.verify.verifier import Verifier, position_limit


@dataclass
class SequenceResult:
    """One prompt's decode. tokens: int64[T] generated ids (EOS included if hit);
    tokens_per_call: tokens emitted by each target call (prefill first)."""

    prompt_ids: np.ndarray
    tokens: np.ndarray
    calls: int
    tokens_per_call: list[int]
    seconds: float
    accepted_drafts: list[int] = field(default_factory=list)  # accepted draft tokens per verify step
    tree_nodes: list[int] = field(default_factory=list)  # verified tree size (root included) per step
    heads_per_step: list[int] = field(default_factory=list)  # 1 where the step's lattice came from the heads

    @property
    def block_efficiency(self) -> float:
        return len(self.tokens) / max(self.calls, 1)


@dataclass
class DecodeResult:
    """sequences: one per prompt, in order; verify_mode: "tree" | "batched" | "generate";
    timing: seconds spent per part (model, lattice, draft, accept) over the whole run;
    steps: list of per-step records (only when ``record_steps``); kv_peak_bytes: 0 where not measured."""

    sequences: list[SequenceResult]
    verify_mode: str
    verify_reason: str
    seconds: float
    timing: dict
    steps: list = field(default_factory=list)
    kv_peak_bytes: int = 0  # the verifier's largest KV cache (keys + values, in-flight nodes included)

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.sequences)

    @property
    def block_efficiency(self) -> float:
        return self.tokens / max(self.calls, 1)


@dataclass
class StepRecord:
    """What one verify step of one row saw: the lattice, the drafts, what was accepted."""

    row: int
    history: np.ndarray
    sausage: object
    drafts: np.ndarray
    accepted: np.ndarray
    bonus: int


def _eos_set(eos_token_id) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (list, tuple, set)):
        return {int(e) for e in eos_token_id}
    return {int(eos_token_id)}


@torch.inference_mode()
def bpd_decode(
    model,
    prompts: list,
    drafter,
    *,
    max_new_tokens: int = 64,
    eos_token_id=None,
    verify: str = "auto",
    record_steps: bool = False,
    on_tokens=None,
    first_row: int = 0,
    tree: str = "fixed",
    context: ContextNgrams | None = None,
    acceptance: AcceptanceModel | None = None,
    draft_vocab=None,
    cost: CostModel | None = None,
    gate: HeadGate | None = None,
    lookahead=None,
    sampling=None,
    draws=None,
    chooser=None,
    kv_cache: str = "auto",
) -> DecodeResult:
    """Decode every prompt with blockwise parallel decoding.

    model: a BlockwiseModel (or any causal LM; without heads every draft is empty).
    prompts: list of int sequences (each >= 1 token). drafter: see ``drafters.Drafter``
    (None: no head drafts: with ``context`` None every step verifies the root alone, which is
    latticedraft's own greedy loop on the same forward, the baseline of the algorithmic gain);
    one copy per row is made with ``drafter.spawn(first_row + row)`` (first_row: the index of
    prompts[0] in the whole prompt set, so per-prompt state such as the oracle's references
    follows the prompt when a caller decodes in chunks). on_tokens(row, new_ids): called as
    tokens are emitted (for streaming).

    tree: "fixed" verifies every drafted path (plus every context n-gram path); "auto" picks
    the nodes that maximise expected tokens per second from the measured cost model (cached
    per model, device, threads and batch size) and ``acceptance`` (calibrated rates; default
    the uncalibrated prior; ``cost`` overrides the measured curve) and, with context n-grams,
    lets ``HeadGate`` (``gate``, default a new one) skip the heads for a step where they measure
    slower. context: context n-gram options (None: off). draft_vocab: token ids (int64[V']) the
    extra heads project onto (None: the full vocabulary). lookahead: ``LookaheadOptions`` (None: off): every row also runs a
    lookahead Jacobi window in the verify call (a side branch) and the n-grams of its pool that
    start with the root become extra tree paths beside the head drafts and context n-grams.
    Verification always uses the full vocabulary, so the output is the same for every setting.
    sampling: ``SamplingOptions`` for lossless speculative sampling (None: greedy); draws: its
    random source (default ``SeededDraws(sampling.seed)``; drafts and verification share it);
    chooser: the acceptance rule (default ``SpeculativeChooser(sampling, draws)``, lossless;
    ``mtad.MtadChooser`` for MTAD's approximate one).
    kv_cache: "auto" | "full" | "rolling" (``verify.choose_kv_cache``: sliding-window models keep
    a rolling buffer of W slots and prefill in chunks of W). Returns a ``DecodeResult``.
    """
    prompts = checked_prompts(model, prompts, max_new_tokens)
    eos = _eos_set(eos_token_id)
    timing = {"model": 0.0, "lattice": 0.0, "draft": 0.0, "accept": 0.0}
    t_start = time.perf_counter()
    slots = getattr(getattr(drafter, "options", None), "slots", None)
    from_heads = drafter is not None and drafter.uses_heads
    heads_used = 1 if not from_heads else None if slots is None else slots + 1  # only the heads drafted from
    if sampling is not None:
        if tree != "fixed" or context is not None or lookahead is not None:
            raise InputError("lossless sampling verifies the drafted paths as drawn: use tree='fixed' without "
                             "context n-grams or a lookahead pool")
        from latticedraft.decoding.accept.sampling import DraftSampler, SpeculativeChooser

        chooser = chooser if chooser is not None else SpeculativeChooser(sampling, draws)
    verifier = Verifier(model, verify, num_heads=heads_used, draft_vocab=draft_vocab if from_heads else None,
                        kv_cache=kv_cache)
    if tree == "auto" and cost is None:
        cost = CostModel.cached(verifier, batch=len(prompts))
    planner = TreePlanner(tree if from_heads or drafter is None else "fixed", context, acceptance, cost)
    if tree == "auto" and context is not None and from_heads:
        gate = gate or HeadGate()  # a caller's gate keeps what it measured across calls
    else:
        gate = None
    vocab = None if verifier.draft_vocab is None else verifier.draft_vocab.ids

    b = len(prompts)
    out: list[list[int]] = [[] for _ in range(b)]
    calls = [0] * b
    per_call: list[list[int]] = [[] for _ in range(b)]
    acc_drafts: list[list[int]] = [[] for _ in range(b)]
    tree_nodes: list[list[int]] = [[] for _ in range(b)]
    used_heads: list[list[int]] = [[] for _ in range(b)]
    done_at = [0.0] * b
    drafters = [None if drafter is None else drafter.spawn(first_row + i) for i in range(b)]
    steps: list[StepRecord] = []
    vocab_size = hf.model_vocab_size(getattr(model, "base", model))
    windows = None if lookahead is None else [lookahead.start(prompts[i], vocab_size, first_row + i) for i in range(b)]
    samplers = None if sampling is None else [DraftSampler(sampling, chooser.draws, first_row + i, vocab_size)
                                              for i in range(b)]

    def emit(i: int, new: list[int]) -> bool:
        """Append tokens to row i; True if the row is finished."""
        stop = False
        take = []
        for t in new:
            take.append(t)
            if t in eos or len(out[i]) + len(take) >= max_new_tokens:
                stop = True
                break
        out[i].extend(take)
        per_call[i].append(len(take))
        calls[i] += 1
        if on_tokens is not None:
            on_tokens(i, take)
        return stop

    t0 = time.perf_counter()
    state, first, heads = verifier.prefill(
        prompts, choose=None if sampling is None else chooser.for_step(list(range(first_row, first_row + b)), None,
                                                                       None, prompts))
    timing["model"] += time.perf_counter() - t0
    active = []  # original row index of each live batch row
    roots = []
    for i in range(b):
        root = int(first[i])
        if emit(i, [root]):
            done_at[i] = time.perf_counter() - t_start
        else:
            active.append(i)
            roots.append(root)
    if active and len(active) < b:  # rows are still in prompt order here
        state.select_rows(torch.as_tensor(active, device=state.valid.device))
        heads = heads[torch.as_tensor(active, device=heads.device)]

    found: dict[int, list] = {}  # row -> context candidates of its next history (searched for the gate)

    def longest_match(rows_new) -> int:
        """The smallest, over live rows, longest context match after each row's new tokens; the
        candidates are kept in ``found`` for the next step's plan."""
        best = []
        for (i, new) in rows_new:
            hist = np.concatenate([prompts[i], np.asarray(out[i], dtype=np.int64), np.asarray(new, dtype=np.int64)])
            found[i] = context.candidates(hist)
            best.append(found[i][0].match if found[i] else 0)  # longest match first
        return min(best, default=0)

    gate_state = {"match": longest_match([(i, []) for i in active]) if gate else 0, "heads": True}

    def want_heads(accepted, bonus) -> bool:
        """The gate's choice for the next step, made after this step's walk (before its heads)."""
        m = longest_match([(i, list(accepted[j]) + [int(bonus[j])]) for j, i in enumerate(active)])
        gate_state["next"] = (m, gate.choose(m))
        return gate_state["next"][1]

    t_step = time.perf_counter()
    while active:
        drafts, sides, qs, histories = [], None if windows is None else [], [], []
        for j, i in enumerate(active):
            history = np.concatenate([prompts[i], np.asarray(out[i], dtype=np.int64)])
            room = max(max_new_tokens - len(out[i]) - 1, 0)  # the bonus token takes the last place
            if sampling is not None:
                t0 = time.perf_counter()
                toks, q = np.zeros((1, 0), np.int64), None
                if drafter is not None and room > 0 and (heads.shape[1] > 0 or not from_heads):
                    toks, q = drafters[i].sample(heads[j] if from_heads else None, vocab, history, samplers[i], room)
                drafts.append(toks)
                qs.append(q)
                histories.append(history)
                tree_nodes[i].append(1 + len({tuple(r[: k + 1]) for r in toks.tolist() for k in range(len(r))}))
                used_heads[i].append(int(from_heads))
                timing["draft"] += time.perf_counter() - t0
                if record_steps:
                    steps.append(StepRecord(i, history, None, toks, None, -1))
                continue
            t0 = time.perf_counter()
            sausage = drafters[i].lattice(heads[j], vocab) if heads.shape[1] > 0 and from_heads else None
            t1 = time.perf_counter()
            if sausage is not None or (drafter is not None and not from_heads):
                d = drafters[i].draft(sausage, history)
            else:
                d = np.zeros((1, 0), np.int64)
            extra = None
            if windows is not None:
                extra = windows[i][1].get(roots[j])[: lookahead.G]
                sides.append(windows[i][0].side())
            plan = planner.plan(sausage, _draft_tokens(d), history, room, extra, found.pop(i, None))
            timing["lattice"] += t1 - t0
            timing["draft"] += time.perf_counter() - t1
            drafts.append(plan.drafts)
            tree_nodes[i].append(plan.nodes)
            used_heads[i].append(int(sausage is not None))
            if record_steps:
                steps.append(StepRecord(i, history, sausage, drafts[-1], None, -1))
        t0 = time.perf_counter()
        choose = None if sampling is None else chooser.for_step([first_row + i for i in active], drafts, qs, histories)
        res = verifier.verify(state, np.asarray(roots, dtype=np.int64), drafts, sides,
                              heads=want_heads if gate is not None else from_heads, choose=choose)
        t1 = time.perf_counter()
        timing["model"] += t1 - t0
        if gate is not None:  # this step's arm, tokens and wall-clock time; then the next step's arm
            gate.update(gate_state["match"], gate_state["heads"], sum(len(a) + 1 for a in res.accepted), t1 - t_step)
            gate_state["match"], gate_state["heads"] = gate_state.pop("next")
        # the step's time outside the verify call (drafting, bookkeeping): what every tree size pays
        planner.overhead = 0.8 * planner.overhead + 0.2 * max(t1 - t_step - (t1 - t0), 0.0)
        still, new_roots, live_rows = [], [], []
        for j, i in enumerate(active):
            if windows is not None:
                for g in windows[i][0].update(res.side_argmax[j]):
                    windows[i][1].add(g)
            acc = [int(t) for t in res.accepted[j]]
            acc_drafts[i].append(len(acc))
            if drafter is not None:
                drafters[i].update(np.asarray(acc, dtype=np.int64))
            if record_steps:
                rec = steps[len(steps) - len(active) + j]
                rec.accepted, rec.bonus = np.asarray(acc, dtype=np.int64), int(res.bonus[j])
            if emit(i, acc + [int(res.bonus[j])]):
                done_at[i] = time.perf_counter() - t_start
            else:
                still.append(i)
                new_roots.append(int(res.bonus[j]))
                live_rows.append(j)
        heads = res.head_logits
        if len(still) < len(active):
            sel = torch.as_tensor(live_rows, dtype=torch.long, device=state.valid.device)
            if still:
                state.select_rows(sel)
                heads = heads[sel.to(heads.device)]
        active, roots = still, new_roots
        t_step = time.perf_counter()
        timing["accept"] += t_step - t1

    seqs = [
        SequenceResult(
            prompt_ids=prompts[i], tokens=np.asarray(out[i], dtype=np.int64), calls=calls[i],
            tokens_per_call=per_call[i], seconds=done_at[i], accepted_drafts=acc_drafts[i],
            tree_nodes=tree_nodes[i], heads_per_step=used_heads[i],
        )
        for i in range(b)
    ]
    return DecodeResult(seqs, verifier.mode, verifier.mode_reason, time.perf_counter() - t_start, timing, steps,
                        verifier.peak_cache_bytes)


def checked_prompts(model, prompts, max_new_tokens: int) -> list[np.ndarray]:
    """Every decoder's first step: ``max_new_tokens >= 1``, prompts as int64 arrays, and prompt +
    new tokens within the model's positions (``prompt_length.check_fits``)."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompts = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    check_fits(position_limit(model), [len(p) for p in prompts], max_new_tokens)
    return prompts


def _draft_tokens(drafts) -> np.ndarray:
    """Accept a ``Drafts`` (``.tokens`` int64[p, d]) or a bare array; returns int64[p, d]."""
    toks = getattr(drafts, "tokens", drafts)
    if isinstance(toks, torch.Tensor):
        toks = toks.detach().cpu().numpy()
    toks = np.asarray(toks, dtype=np.int64)
    if toks.ndim == 1:
        toks = toks[None]
    if toks.shape[0] == 0:
        toks = np.zeros((1, 0), dtype=np.int64)
    return toks


@torch.no_grad()
def greedy_decode(model, prompts: list, *, max_new_tokens: int = 64, eos_token_id=None) -> DecodeResult:
    """Plain autoregressive greedy decoding with transformers' ``generate`` on the base model,
    one prompt at a time (no padding): the baseline every table compares against."""
    base = getattr(model, "base", model)
    prompts = checked_prompts(model, prompts, max_new_tokens)
    eos = _eos_set(eos_token_id)
    t_start = time.perf_counter()
    seqs = []
    for p in prompts:
        t0 = time.perf_counter()
        ids = torch.as_tensor(p[None], device=next(base.parameters()).device)
        gen = base.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos) if eos else None, pad_token_id=0,
            num_beams=1, temperature=None, top_p=None, top_k=None,
        )
        toks = gen[0, len(p):].cpu().numpy()
        cut = [k for k, t in enumerate(toks.tolist()) if t in eos]
        if cut:
            toks = toks[: cut[0] + 1]
        seqs.append(SequenceResult(p, toks.astype(np.int64), len(toks), [1] * len(toks), time.perf_counter() - t0))
    dt = time.perf_counter() - t_start
    return DecodeResult(seqs, "generate", "plain autoregressive decoding", dt, {"model": dt})
