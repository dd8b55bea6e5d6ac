"""What a ``--method bpd`` decode loads, fits and measures for a ``DrafterSpec``, each memoised on
the ``Session`` (``session.once``): the drafter (lattice drafter or draft model), the oracle's
references, the head gate, the draft vocabulary, the n-gram LM's drafts, the acceptance rates
(fitted on held-out prompts, cached on disk). The session itself knows no decoder; ``methods/bpd.py``
asks for these where it runs and prepares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latticedraft.decoding.runs.loaders import default_model_dir
from latticedraft.paths import data_dir

AUTO_DRAFT_VOCAB = 1024  # V' of the bundled heads: 80% of corpus tokens, projection 8x cheaper
AUTO_LM_DRAFTS = 3  # tokens of the n-gram LM's continuation: deeper ones measured slower (docs/speed.md)
# the file each drafter reads (loaded here, fingerprinted in ``--output``); LM drafts read the LM too
DRAFTER_FILES = {"ngram": "lm", "parallel": "lm", "neural": "rescorer", "model": "draft_model"}
CALIBRATION_PROMPTS = slice(30, 42)  # the tuning split (Appendix E): never in the benchmark or eval prompts


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
        return build() if fresh else session.once(("draft_model_proposer", spec.gamma, spec.draft_confidence), build)
    lm = session.lm if DRAFTER_FILES.get(spec.name) == "lm" else None
    rescorer = session.rescorer if spec.name == "neural" else None
    return make_drafter(spec.name, options=spec.lattice_options(), lm=lm, rescorer=rescorer, alpha=spec.alpha,
                        nbest=spec.nbest, references=references)


def references(session, prompts: list, max_new_tokens: int) -> list[np.ndarray]:
    """The target's greedy continuations of ``prompts`` (what the oracle drafter drafts), computed
    with ``generate`` once per prompt list and budget in this session."""
    from latticedraft.decoding.methods.greedy import greedy_decode

    key = ("references", max_new_tokens, tuple(tuple(int(t) for t in p) for p in prompts))
    return session.once(key, lambda: [q.tokens for q in greedy_decode(session.model, prompts, eos_token_id=session.eos,
                                                                     max_new_tokens=max_new_tokens).sequences])


def gate(session, spec):
    """The ``HeadGate`` of ``spec`` for this session: what it measured carries over between
    calls (a command decodes its prompts one call at a time)."""
    from latticedraft.decoding.planning.head_gate import HeadGate

    return session.once(("gate", repr(spec)), HeadGate)


def correction(session, spec, sampling):
    """The ``RateCorrection`` of ``spec``'s auto tree at these sampling settings (None: greedy)
    for this session: what the fitted rates missed carries over between calls, as the gate's
    measurements do."""
    from latticedraft.decoding.planning.acceptance import RateCorrection

    return session.once(("correction", repr(spec), repr(sampling)), RateCorrection)


def swap_gate(session, spec, new):
    """Make ``new`` the ``HeadGate`` of ``spec`` for the calls that follow; returns the one it
    replaces (a pass that should neither follow nor teach the session's gate brings its own)."""
    gate(session, spec)
    return session.keep(("gate", repr(spec)), new)


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


def lm_drafts(session, spec):
    """What ``spec.lm_drafts`` drafts from: (``LMNgrams``, the LM's ``LMArrays``) or None (off;
    "auto" where no LM built with this tokenizer is there, ``loaders.lm_for``; an LM named with
    ``--lm`` must load and fit)."""
    from latticedraft.decoding.proposers.lm_ngrams import LMNgrams
    from latticedraft.errors import ModelError
    from latticedraft.lattice.lm_tables import lm_arrays
    from latticedraft.decoding.runs.loaders import lm_for

    depth = spec.lm_drafts
    if not depth:
        return None
    if depth == "auto":
        if session.lm_dir is None:  # the LM that fits this tokenizer where one is built (one named with --lm must)
            if not lm_for(session.tokenizer).is_dir():
                return None
            try:
                _ = session.lm
            except ModelError:  # built with another vocabulary: no LM drafts, the rest as asked
                return None
        depth = AUTO_LM_DRAFTS
    return session.once(("lm_drafts", session.lm_dir, int(depth)),
                        lambda: (LMNgrams(int(depth)), lm_arrays(session.lm.fst)))


def acceptance(session, spec):
    """Acceptance rates for ``spec``'s drafts, fitted on the held-out calibration prompts
    (``CALIBRATION_PROMPTS`` of data/prompts.jsonl) and cached on disk per model and lattice
    settings; looked up once per session and spec."""
    return session.once(("acceptance", repr(spec)), lambda: _fit_acceptance(session, spec))


def _fit_acceptance(session, spec):
    from dataclasses import replace

    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.planning.acceptance import cached
    from latticedraft.decoding.planning.calibrate import calibrate
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.decoding.runs.prompt_set import read_prompts

    file = data_dir() / "prompts.jsonl"
    recs = read_prompts(file)[CALIBRATION_PROMPTS] if file.is_file() else []
    lm = lm_drafts(session, spec)
    if not recs or spec.name in ("oracle", "model") or (spec.name == "none" and lm is None):
        return None  # the planner falls back to the uncalibrated prior (no head lattices or LM drafts to fit)
    key = acceptance_key(session, spec, lm, [r["prompt"] for r in recs])
    calib = replace(spec, tree="fixed", context_ngrams=0, lookahead=None)

    def build():
        if session.notify:
            session.notify(f"--tree auto: fitting acceptance rates for --drafter {spec.name} on {len(recs)} held-out "
                           "prompts and measuring the step cost T(n) of this model (once per model and settings; "
                           "cached under .cache/acceptance and .cache/cost_model)")
        ids = encode(session.tokenizer, [r["prompt"] for r in recs])
        drafter, vocab = proposer(session, calib), draft_vocab(session, spec.draft_vocab)

        def decode(prompts, max_new_tokens, on_tokens):
            return bpd_decode(session.model, prompts, drafter, BpdPlan(tree="fixed", draft_vocab=vocab),
                              Request(max_new_tokens=max_new_tokens, eos_token_id=session.eos, record_steps=True,
                                      on_tokens=on_tokens))

        return calibrate(decode, ids, context=spec.context(), lm=lm)

    return cached(key, build)


def acceptance_key(session, spec, lm, prompts: list[str]) -> dict:
    """What fitted rates depend on: the weights' files and the dtype they run in (a bfloat16
    verifier rounds its argmax differently), the lattice settings, the LM drafts and the prompts."""
    weights = [p for p in Path(session.base_dir).glob("*.safetensors")]
    if session.model_dir is not None or default_model_dir().exists():
        weights += list(Path(session.model_dir or default_model_dir()).glob("*.safetensors"))
    return {"weights": sorted((str(w.resolve()), w.stat().st_size, w.stat().st_mtime_ns) for w in weights),
            "dtype": str(next(session.model.parameters()).dtype),
            "spec": spec.acceptance_key(),
            "lm_drafts": None if lm is None else {"depth": lm[0].depth, "lm": str(session.lm.build_dir.resolve()),
                                             "built": session.lm.manifest.get("built_at")},
            "prompts": prompts}


def load(session, spec) -> None:
    """Load and check what ``spec`` drafts from: the LM's tables and kernels, the rescorer, the draft
    model, the draft vocabulary, the LM drafts' tables (``methods/bpd.py`` then warms the tree up)."""
    if DRAFTER_FILES.get(spec.name) == "lm":
        from latticedraft.lattice.lm_tables import lm_arrays
        from latticedraft.lattice.search import warm_up

        lm_arrays(session.lm.fst)
        warm_up(int(session.lm.fst.order))
    if spec.name == "neural":
        _ = session.rescorer
    if spec.name == "model":
        _ = session.draft_model
    draft_vocab(session, spec.draft_vocab)  # a missing or bad draft_vocab.json fails here
    spec.context()
    lm = lm_drafts(session, spec)  # the LM's tables, its states' best next tokens and the chain kernel
    if lm is not None:
        lm[0].continuation(lm[1], np.zeros(1, dtype=np.int64))
