"""The target's own weights at 4 bits as its drafter (``--self-draft int4|int8|auto|off``).

A ``LeanStack`` over the target with every projection, the output projection included, quantized
at load (``gpu.models.quantized``: int4 groupwise by default, int8 per channel; bfloat16
activations into torch's weight-only kernels) drafts a chain after each row's root, one token
per forward, greedily (its argmax) or under sampling with the run's noise (its perturbed
argmax: the target's token wherever the two distributions agree, ``accept/sampling.py``). The
target verifies in float32 as ever, so the output is exactly the target's.

**Its keys and values are the target's.** A draft forward attends to the verifier's own cache
(``Step.cache``: the float32 keys and values of every accepted token, exact) and writes the
keys and values of the tokens it drafts into pending slots after it, which it drops before the
verify call (``KVCache.truncate``): rolling back a rejected draft is that one assignment, no
prefill of the prompt runs in 4 bits, and the self-draft adds no cache memory, only its
quantized weights (SmolLM2-135M: 84 MB against 538 MB of float32 weights).

**How long a chain.** Each drafted token's chance of being accepted is its draft probability,
calibrated online on what the target kept (``planning.acceptance.RateCorrection``, per
probability bin; learned across the session's calls). With a cost-aware tree (``Step.cost``:
C(n), the step's predicted seconds at n nodes per row: the verify call's T(n) and the step's
other work, drafting included, as measured) the chain grows while the next token pays for
itself: while ``P_next / (t_d + C(n+1) - C(n)) > E / C(n)``, E the step's expected tokens (per
row 1 + the sum of its chain's prefixes' chances), t_d the measured seconds of one draft forward
at this batch size
and P_next the chance that the chain's next token is accepted (guessed as the chain's chance
times the last token's rate). Without a cost model it stops where every chain's chance is below
``CONFIDENCE``.

**Near-ties branch.** Where the draft's runner-up has at least ``BRANCH`` of its top
probability, the runner-up joins the tree as a leaf beside the chain's token (the self-draft's
top-2 sausage lattice, thresholded): rated by its own calibrated chance, kept by the cost-aware
tree only where it pays.

    >>> src = SelfDraftProposer(LeanStack(model, Scheme("int4")))     # doctest: +SKIP
"""

from __future__ import annotations

import time

import numpy as np

from latticedraft import learned_state
from latticedraft.decoding.proposers.base import Proposal, Proposer, Step
from latticedraft.decoding.registry import option
from latticedraft.decoding.sources import DraftSource
from latticedraft.errors import InputError, ModelError

KINDS = ("auto", "int4", "int8", "off")
MAX_DEPTH = 24  # the longest chain a step drafts (the measured costs stop it sooner)
CONFIDENCE = 0.3  # without a cost model: stop once the chain's chance is below this
BRANCH = 0.5  # a runner-up with at least this share of the top probability joins the tree
AUTO_RATIO = 0.5  # auto: on where a draft forward costs at most this share of a float forward
AUTO_KINDS = ("int4", "int8")  # auto: the schemes it times against each other
CHAIN, RUNNER_UP = 0, 1  # calibration sources


class SelfDraftProposer(Proposer):
    """Chains drafted by ``stack`` (a quantized ``LeanStack`` of the target) over the verifier's
    cache. ``calibration``: draft probability -> chance of acceptance, for chain tokens and
    runner-ups; ``seconds``: batch rows -> measured seconds of one draft forward (both learned
    across calls)."""

    name = "self_draft"
    admits = True

    def __init__(self, stack, max_depth: int = MAX_DEPTH):
        from latticedraft.decoding.planning.acceptance import RateCorrection

        self.stack, self.max_depth = stack, int(max_depth)
        self.calibration = RateCorrection(decay=1.0, sources=2)
        self.seconds: dict[int, float] = {}
        self.drafted: dict[int, tuple] = {}  # row -> (chain tokens, their probs, runner-ups, their probs) of this step

    def propose(self, step: Step) -> list[Proposal]:
        cache = step.cache
        if cache is None or cache.first_layer != 0:
            raise ModelError("the self-draft shares the verifier's cache of every layer: it needs tree verification "
                             "(--verify tree); drop --self-draft or the --verify option")
        rooms = np.asarray(step.rooms, dtype=np.int64)
        depth = int(min(self.max_depth, rooms.max(initial=0)))
        self.drafted = {}
        if depth == 0:
            return [Proposal.empty() for _ in step.rows]
        chain, alts = self._draft(step, cache, rooms, depth)
        return [self._proposal(step, j, chain[j], alts[j]) for j in range(len(step.rows))]

    def _draft(self, step: Step, cache, rooms: np.ndarray, depth: int) -> tuple[list, list]:
        """Per row, the chain [(token, prob)] and the runner-ups [(depth, token, prob)] drafted over
        the verifier's cache; the cache is left as it was."""
        import torch

        b, length = len(step.rows), cache.length
        chain, alts = [[] for _ in range(b)], [[] for _ in range(b)]
        x = np.asarray([int(h[-1]) for h in step.histories], dtype=np.int64)
        chance = np.ones(b)  # each row's chance that its chain so far is accepted
        expected = np.ones(b)  # each row's expected tokens from the step: 1 + the sum of its prefixes' chances
        try:
            with torch.inference_mode():
                for t in range(depth):
                    t0 = time.perf_counter()
                    logits = self._forward(cache, x, t)
                    toks, probs = self._pick(step, logits, t, chain, alts)
                    self._timed(b, time.perf_counter() - t0)
                    live = t < rooms
                    for j in np.flatnonzero(live):
                        chain[j].append((int(toks[j]), float(probs[j])))
                    rate = self.calibration.corrected(probs, CHAIN) * live
                    chance = chance * rate
                    expected = expected + chance
                    if t + 1 == depth or not self._worth(step, chance, rate, expected.sum(), t + 2, b):
                        break
                    x = toks
        finally:
            cache.truncate(length)
        return chain, alts

    def _forward(self, cache, x: np.ndarray, t: int):
        """One draft forward: token x[j] of every row at its root's position + t, after the cache's
        committed and pending slots; the logits float32[b, V] after it."""
        import torch

        from latticedraft.gpu.masks import visible

        st = self.stack
        b = len(x)
        valid, pos = cache.keys()
        q_pos = st.split.clamp(cache.next_pos + t)[:, None]
        allowed = visible(valid, pos, q_pos, np.ones((b, 1, 1), dtype=bool), st.split.window)
        mask = None if allowed.all() else torch.from_numpy(allowed).to(st.split.device)[:, None]
        cache.reserve(1)
        p = torch.from_numpy(q_pos).to(st.split.device)
        logits = st.token_logits(torch.from_numpy(x[:, None]).to(st.split.device), p, mask, cache)
        cache.mark(np.ones((b, 1), dtype=bool), q_pos)
        return logits

    def _pick(self, step: Step, logits, t: int, chain: list, alts: list) -> tuple[np.ndarray, np.ndarray]:
        """Each row's draft token at depth t and its probability (greedy: the argmax; sampling: the
        perturbed argmax under the row's noise); near-tie runner-ups go to ``alts``."""
        import torch

        if step.samplers is None:
            top = torch.softmax(logits, dim=-1).topk(2, dim=-1)
            probs, toks = top.values.cpu().numpy().astype(np.float64), top.indices.cpu().numpy()
        else:
            toks, probs = np.zeros((len(logits), 2), dtype=np.int64), np.zeros((len(logits), 2))
            for j, sampler in enumerate(step.samplers):
                context = np.concatenate([step.histories[j], [c for c, _ in chain[j]]]).astype(np.int64)
                q = sampler.probs(logits[j:j + 1], [context])[0]
                order = sampler.ranked(q, len(step.histories[j]) + t)
                toks[j, : len(order)], probs[j, : len(order)] = order, q[order]
        for j in range(len(toks)):
            if probs[j, 1] >= BRANCH * probs[j, 0] and probs[j, 1] > 0:
                alts[j].append((t, int(toks[j, 1]), float(probs[j, 1])))
        return toks[:, 0], probs[:, 0]

    def _timed(self, b: int, seconds: float) -> None:
        """Keep the running estimate of one draft forward's seconds at ``b`` rows."""
        old = self.seconds.get(b)
        self.seconds[b] = seconds if old is None else 0.9 * old + 0.1 * seconds

    def _worth(self, step: Step, chance: np.ndarray, rate: np.ndarray, expected: float, nodes: int, b: int) -> bool:
        """Whether drafting one more token pays: with a cost model, when its expected tokens per
        second beat the step's (module doc; the next token's chance is guessed as the last one's
        rate again: confident runs go on); without, while some chain's chance is at least
        ``CONFIDENCE``. ``step.cost(n)`` holds the step's other seconds too (drafting included)."""
        if step.cost is None:
            return bool(chance.max(initial=0.0) >= CONFIDENCE)
        more = self.seconds[b] + step.cost(nodes + 1) - step.cost(nodes)
        return (chance * rate).sum() / max(more, 1e-9) > expected / max(step.cost(nodes), 1e-9)

    def _proposal(self, step: Step, j: int, chain: list, alts: list) -> Proposal:
        """Row j's chain and its near-tie runner-ups (each a path: the chain's prefix + the runner-up)."""
        if not chain:
            return Proposal.empty()
        toks = np.asarray([c for c, _ in chain], dtype=np.int64)
        probs = np.asarray([p for _, p in chain])
        alts = [a for a in alts if a[0] < len(chain)]
        self.drafted[step.index[j]] = (toks, probs, alts)
        paths = np.full((1 + len(alts), len(chain)), -1, dtype=np.int64)
        paths[0] = toks
        rates = None
        if step.acceptance is not None:
            rates = np.zeros(paths.shape)
            rates[0] = self.calibration.corrected(probs, CHAIN)
        for k, (t, tok, p) in enumerate(alts, start=1):
            paths[k, :t] = toks[:t]
            paths[k, t] = tok
            if rates is not None:
                rates[k, : t] = rates[0, : t]
                rates[k, t] = self.calibration.corrected([p], RUNNER_UP)[0]
        return Proposal(paths, rates=rates)

    def update(self, step: Step, accepted, bonus, side_argmax) -> None:
        """Calibrate on what the target emitted after each row's root (its accepted tokens and
        bonus): every chain token whose prefix was right was tried, and kept where it is the
        target's; a runner-up was tried where the chain's prefix before it was right."""
        for j, i in enumerate(step.index):
            if i not in self.drafted:
                continue
            toks, probs, alts = self.drafted[i]
            kept = np.concatenate([np.asarray(accepted[j], dtype=np.int64), np.asarray(bonus[j]).reshape(-1)])
            m = min(len(toks), len(kept))
            miss = np.flatnonzero(toks[:m] != kept[:m])
            hits = int(miss[0]) if len(miss) else m
            tried = min(hits + 1, m)
            self.calibration.observe(probs[:tried], np.arange(tried) < hits, np.full(tried, CHAIN))
            seen = [(p, kept[t] == tok) for t, tok, p in alts if t <= hits and t < len(kept)]
            if seen:
                self.calibration.observe(np.asarray([p for p, _ in seen]), np.asarray([k for _, k in seen]),
                                         np.full(len(seen), RUNNER_UP))


def build(session, value: str) -> SelfDraftProposer | None:
    """A self-draft proposer of ``value`` for the session's model (None: off), over the quantized
    stack the session builds once per value (``quantized_stack``): a warm-up's fresh proposer
    shares it and its decision."""
    stack = session.once(("self_draft_stack", value), lambda: quantized_stack(session, value))
    return None if stack is None else SelfDraftProposer(stack)


def quantized_stack(session, value: str):
    """The quantized ``LeanStack`` of the session's model for ``value``: "int4" / "int8" (refused in
    one line where the model, the torch build or the device cannot run it), "auto" (int4 and int8
    built and timed against a float forward on this machine; the faster, where it costs at most
    ``AUTO_RATIO`` of a float one, else None). Its draft forward runs in one call of the fused
    kernels (``gpu/verify/fused_draft.py``) where they build and run the model, else op by op."""
    from latticedraft.gpu.models.quantized import kernels_missing
    from latticedraft.gpu.verify.lean import supports
    from latticedraft.gpu.verify.modes import model_device

    model = session.model
    why = supports(model) or kernels_missing(model_device(model))
    if why is not None:
        if value == "auto":
            session.learned.event(f"--self-draft auto: off ({why})")
            return None
        raise ModelError(f"--self-draft {value}: {why}")
    if value != "auto":
        return _built(session, value)
    key = _choice_key(session)
    kept = learned_state.read(CHOICE, f"{key}.json", note=session.learned.event, check=lambda d: None if d["key"] == key
                              else "made for another model or machine")
    if kept is not None:
        timed = ", ".join(f"{k} {r:.2f}x" for k, r in kept["ratios"].items())
        on = kept["ratios"][kept["scheme"]] <= AUTO_RATIO
        session.learned.event(f"--self-draft auto: {kept['scheme'] if on else 'off'} (read from "
                              f"{CHOICE.path(key + '.json')}: a draft forward took {timed} a float one there)")
        return _built(session, kept["scheme"]) if on else None
    return _fastest(session, {kind: _built(session, kind) for kind in AUTO_KINDS}, key)


def _built(session, kind: str):
    """The ``kind`` stack of the session's model with its fused kernels where they run (events say
    what was built, and why a draft runs op by op)."""
    from latticedraft.gpu.models.quantized import Scheme
    from latticedraft.gpu.verify.fused_draft import FusedDraft
    from latticedraft.gpu.verify.lean import LeanStack

    t0 = time.perf_counter()
    stack = LeanStack(session.model, Scheme(kind))
    built = time.perf_counter() - t0
    if stack.fallbacks:
        session.learned.event(f"--self-draft: {len(stack.fallbacks)} projection(s) not in {stack.scheme.kind}: "
                              f"{stack.fallbacks[0]}" + (" ..." if len(stack.fallbacks) > 1 else ""))
    stack.fused, why = FusedDraft.of(stack, progress=session.notify)
    how = "fused kernels" if why is None else f"op by op ({why})"
    session.learned.event(f"--self-draft: {kind} copy built in {built:.2f} s, {stack.nbytes() / 2**20:.1f} MiB; "
                          f"its forward runs as {how}")
    return stack


def _fastest(session, stacks: dict, key: str):
    """Of ``stacks`` (kind -> stack), the one whose token forward is fastest against a float one on
    this machine (measured, and kept under ``key`` in the cache), None where even it costs more
    than ``AUTO_RATIO``."""
    import json

    from latticedraft.gpu.verify.lean import stack_for, token_seconds

    ratios = {kind: round(token_seconds(st, stack_for(session.model)), 4) for kind, st in stacks.items()}
    best = min(ratios, key=ratios.get)
    learned_state.write(CHOICE, f"{key}.json", json.dumps({"key": key, "scheme": best, "ratios": ratios}))
    timed = ", ".join(f"{k} {r:.2f}x" for k, r in ratios.items())
    dtype = stacks[best].split.dtype
    if ratios[best] > AUTO_RATIO:
        session.learned.event(f"--self-draft auto: off (a draft forward takes {timed} a {dtype} one: it would not pay)")
        return None
    session.learned.event(f"--self-draft auto: {best} (a draft forward takes {timed} a {dtype} one, measured)")
    return stacks[best]


def _choice_key(session) -> str:
    """What the measured choice depends on, hashed: the model's configuration and dtype, torch,
    its threads, the CPU and the fused kernels' source."""
    import hashlib
    import json

    import torch

    from latticedraft.gpu.verify.fused_draft import SOURCE, cpu_signature

    lm = getattr(session.model, "base", None) or session.model
    cfg = {k: v for k, v in lm.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    parts = [json.dumps(cfg, sort_keys=True, default=str), str(next(lm.parameters()).dtype), torch.__version__,
             str(torch.get_num_threads()), cpu_signature(), SOURCE.read_text()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _choice_schema(d) -> str | None:
    why = learned_state.fields(d, "key", "scheme", "ratios")
    if why:
        return why
    if d["scheme"] not in AUTO_KINDS or not isinstance(d["key"], str) or not isinstance(d["ratios"], dict):
        return "scheme, key or ratios mistyped"
    if set(d["ratios"]) != set(AUTO_KINDS) or not all(learned_state.finite(r) and r > 0 for r in d["ratios"].values()):
        return f"ratios are not positive numbers for {', '.join(AUTO_KINDS)}"
    return None


CHOICE = learned_state.kind("self_draft", "the self-draft's measured scheme", _choice_schema,
                            example=lambda: {"key": "k", "scheme": "int4", "ratios": {"int4": 0.1, "int8": 0.14}})


def _check(value) -> str:
    if value not in KINDS:
        raise InputError(f"--self-draft {value!r} is not one of {', '.join(KINDS)}")
    return value


SOURCE = DraftSource(
    name="self_draft", dest="self_draft", summary="the model's own weights at 4 bits, drafting a chain per step",
    option=option("off", cli="auto", fit=False, group="tree", choices=KINDS, help=(
        "also draft with the model's own weights quantized at load (int4: groups of 32; int8: per channel), "
        "sharing the verifier's cache; the chain stops where the next token no longer pays under the measured "
        "costs (default auto: int4 or int8, whichever forward is faster on this machine, where the lean path runs "
        "the model and it costs at most half a float one)")),
    build=build, check=_check, rates="online", shares_cache=True, lean=("int4", "int8"))
