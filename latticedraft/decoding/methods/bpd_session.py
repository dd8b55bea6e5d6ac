"""What a ``--method bpd`` decode loads, fits and measures for a ``DrafterSpec``, each memoised on
the ``Session``: the drafter (lattice drafter or draft model), the oracle's references, the draft
vocabulary (``session.once``) and the acceptance counts (counted from the session's own greedy
steps, stored on disk per model and settings; kept in ``session.learned`` with the head gate and
the rate corrections). The session itself knows no decoder; ``methods/bpd.py`` asks for these
where it runs and prepares.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

from latticedraft.decoding.drafters import file_of
from latticedraft.decoding.runs.loaders import default_model_dir

AUTO_DRAFT_VOCAB = 1024  # V' of the bundled heads: 80% of corpus tokens, projection 8x cheaper
SETTLED = 20000  # observations in the heads' and sources' tables past which a session stops counting


def proposer(session, spec, references=None, fresh: bool = False):
    """The draft source of a ``bpd.DrafterSpec``: a lattice ``Drafter`` of the heads, the draft
    model's ``ModelProposer`` (one per session and settings, so that its acceptance calibration
    carries over between calls; ``fresh``: a new one), or None (``--drafter none``)."""
    from latticedraft.decoding.proposers.heads import make_drafter

    if spec.name == "none":
        return None
    if spec.name == "model":
        build = lambda: make_drafter("model", draft_model=session.draft_model, gamma=spec.gamma,  # noqa: E731
                                     confidence=spec.draft_confidence)
        return build() if fresh else session.learned.source("draft_model", (spec.gamma, spec.draft_confidence), build)
    lm = session.lm if file_of(spec.name) == "lm" else None
    rescorer = session.rescorer if spec.name == "neural" else None
    learner = None
    if learns_alpha(spec):  # the session's, or for a warm-up a copy that teaches it nothing
        learner = rescore_weight(session, spec)
        learner = copy.deepcopy(learner) if fresh else learner
    return make_drafter(spec.name, options=spec.lattice_options(), lm=lm, rescorer=rescorer, alpha=spec.alpha,
                        nbest=spec.nbest, references=references, learner=learner)


def learns_alpha(spec) -> bool:
    """Whether ``spec``'s drafter learns the n-gram weight (``--drafter ngram / parallel`` without
    ``--alpha``: ``spec.alpha`` None)."""
    return spec.alpha is None and file_of(spec.name) == "lm"


def rescore_weight(session, spec):
    """The ``AlphaLearner`` of ``spec``'s n-gram drafter: the one stored for this model, LM and
    lattice settings in the cache's rescore_weight folder, else a new one (alpha 0); looked up once
    per session (``session.learned``), then taught by every greedy decode call."""
    from latticedraft.decoding.planning import rescore_weight as rw

    key = rescore_weight_key(session, spec)

    def stored():
        found = rw.load(key, note=session.learned.event)
        session.learned.event(f"n-gram weight (alpha) of --drafter {spec.name}: " + (
            f"{found.summary()}, read from {rw.path_of(key)}" if found else "none learned yet, starts at 0 (the heads' "
                                                                           "own ranking)"))
        return found or rw.AlphaLearner()

    return session.learned.rescore_weight(key, stored)


STORE_EVERY = 8  # scored comparisons a learner gathers between two writes of its cache entry


def store_rescore_weight(session, spec) -> None:
    """Store what ``spec``'s learner holds now (the next sessions start from it) after the session's
    first decode call, when its weight changed and after every ``STORE_EVERY`` scored comparisons
    (a write costs ~2 ms: after every short call it cost ~2% of the decode); say the weight after
    the first call and whenever it changes."""
    from latticedraft.decoding.planning import rescore_weight as rw

    learner = rescore_weight(session, spec)
    if learner.stored is None or learner.arm != learner.reported or learner.scored - learner.stored >= STORE_EVERY:
        rw.store(rescore_weight_key(session, spec), learner)
        learner.stored = learner.scored
    if learner.arm != learner.reported:
        learner.reported = learner.arm
        session.learned.event(f"n-gram weight (alpha) of --drafter {spec.name} learned: {learner.summary()}")


def rescore_weight_key(session, spec) -> dict:
    """What the learned weight depends on: the weights and dtype (as the acceptance counts), the
    LM build, the lattice and the paths drawn from it, and the tree policy (every path verified, or
    the cost-aware tree's share of them: what a ranking is scored by)."""
    model = acceptance_key(session, spec, [])
    lattice = ("name", "k", "prune", "eps", "backoff", "slots", "nbest", "draft_vocab", "tree")
    return {"weights": model["weights"], "dtype": model["dtype"], "lm": str(session.lm.build_dir.resolve()),
            "built": session.lm.manifest.get("built_at"), "drafter": {f: getattr(spec, f) for f in lattice}}


def references(session, prompts: list, max_new_tokens: int) -> list[np.ndarray]:
    """The target's greedy continuations of ``prompts`` (what the oracle drafter drafts), computed
    with ``generate`` once per prompt list and budget in this session."""
    from latticedraft.decoding.methods.greedy import greedy_decode

    key = ("references", max_new_tokens, tuple(tuple(int(t) for t in p) for p in prompts))
    return session.once(key, lambda: [q.tokens for q in greedy_decode(session.model, prompts, eos_token_id=session.eos,
                                                                     max_new_tokens=max_new_tokens).sequences])


def draft_vocab(session, size: int | str | None):
    """The ``size`` most frequent token ids of the heads' training corpus (int64[size]),
    from ``draft_vocab.json`` beside the head checkpoint; None for None (and for "auto"
    where the checkpoint has no ranking, or a plain causal LM without heads). "auto" is
    ``AUTO_DRAFT_VOCAB``, or fewer where the heads were trained on fewer (``trained_size``)."""
    from latticedraft.gpu.models.draft_vocab import FILE, load_ranked, trained_size

    where = Path(session.model_dir) if session.model_dir is not None else default_model_dir()
    if size == "auto":
        if getattr(session.model, "num_heads", 1) < 2 or not (where / FILE).is_file():
            return None
        # the file is read once per session, not at every call
        size = session.once(("draft_vocab_auto", str(where)),
                            lambda: min(AUTO_DRAFT_VOCAB, trained_size(where) or AUTO_DRAFT_VOCAB))
    if size is None:
        return None
    return session.once(("draft_vocab", str(where), int(size)), lambda: load_ranked(where, int(size)))


def acceptance(session, spec):
    """The acceptance counts ``spec``'s auto tree rates paths with: those stored for this model,
    dtype and settings in the cache's acceptance folder, else none yet (the priors); looked up once per
    session and spec (``session.learned``), then added to by ``count_steps``."""
    from latticedraft.decoding.planning.acceptance import AcceptanceModel, load, path_of

    def stored():
        key = acceptance_key(session, spec, counted_sources(spec, session))
        found = load(key, note=session.learned.event)
        session.learned.event(f"acceptance counts for --drafter {spec.name}: "
                              + (f"{found.counts} read from {path_of(key)}" if found else "none yet (the priors)"))
        return found or AcceptanceModel()

    return session.learned.acceptance(spec, stored)


def counted_sources(spec, session=None) -> list:
    """The draft sources ``spec`` turns on whose rate tables are counted (``rates="fitted"``); with
    ``session``, those that draft there (``built``): ``--lm-drafts auto`` builds nothing without an LM
    that fits, and is then counted (and keyed) as ``--lm-drafts 0``, reading no LM."""
    from latticedraft.decoding.sources import sources

    on = [s for s in sources() if s.on(spec) and s.rates == "fitted"]
    return on if session is None else [s for s in on if built(session, spec, s) is not None]


def built(session, spec, source):
    """The session's proposer of draft source ``source`` at ``spec``'s value (None: it drafts nothing)."""
    value = getattr(spec, source.dest)
    return session.learned.source(source.name, value, lambda: source.build(session, value))


def counting(session, spec, sampling) -> bool:
    """Whether a decode of ``spec`` records its steps to count them (``count_steps``): greedy
    decodes of the auto tree whose tables have not settled (``SETTLED`` observations)."""
    if spec.tree != "auto" or sampling is not None or spec.name in ("oracle", "model"):
        return False
    if spec.name == "none" and not counted_sources(spec, session):
        return False  # nothing of it is counted: no lattice, no source table
    return sum(acceptance(session, spec).counts.values()) < SETTLED


def count_steps(session, spec, result) -> None:
    """Add the recorded steps of ``result`` (a greedy decode of ``spec``) to its acceptance counts
    and store them (the next sessions start from them)."""
    from latticedraft.decoding.planning.acceptance import store
    from latticedraft.decoding.planning.calibrate import counted

    fitted = counted_sources(spec, session)
    delta = counted(result, tuple((s.name, built(session, spec, s), s.bins) for s in fitted))
    model = acceptance(session, spec).add(delta)
    session.learned.fitted[session.learned.key_of(spec)] = model
    store(acceptance_key(session, spec, fitted), model)


def acceptance_key(session, spec, fitted: list) -> dict:
    """What the counts depend on: the weights' files and the dtype they run in (a bfloat16
    verifier rounds its argmax differently), the lattice settings and the counted sources (each
    one's value and the files it reads)."""
    weights = [p for p in Path(session.base_dir).glob("*.safetensors")]
    if session.model_dir is not None or default_model_dir().exists():
        weights += list(Path(session.model_dir or default_model_dir()).glob("*.safetensors"))
    return {"weights": sorted((str(w.resolve()), w.stat().st_size, w.stat().st_mtime_ns) for w in weights),
            "dtype": str(next(session.model.parameters()).dtype),
            "spec": spec.acceptance_key(),
            "sources": {s.name: {"value": getattr(spec, s.dest), **({"lm": str(session.lm.build_dir.resolve()),
                                                                     "built": session.lm.manifest.get("built_at")}
                                                                    if "lm" in s.files else {})} for s in fitted}}


def load(session, spec) -> None:
    """Load and check what ``spec`` drafts from: the LM's tables and kernels, the rescorer, the draft
    model, the draft vocabulary, the draft sources (``methods/bpd.py`` then warms the tree up)."""
    from latticedraft.decoding.sources import build_all

    if file_of(spec.name) == "lm":
        from latticedraft.lattice.lm_tables import lm_arrays
        from latticedraft.lattice.search import warm_up

        lm_arrays(session.lm.fst)
        warm_up(int(session.lm.fst.order))
    if spec.name == "neural":
        _ = session.rescorer
    if spec.name == "model":
        _ = session.draft_model
    draft_vocab(session, spec.draft_vocab)  # a missing or bad draft_vocab.json fails here
    build_all(session, spec)  # each source's tables and kernels (the LM's states' best next tokens ...)
