"""What a ``--method bpd`` decode loads, fits and measures for a ``DrafterSpec``, each memoised on
the ``Session``: the drafter (lattice drafter or draft model), the oracle's references, the draft
vocabulary (``session.once``) and the acceptance rates (fitted on held-out prompts, cached on disk;
kept in ``session.learned`` with the head gate and the rate corrections). The session itself knows
no decoder; ``methods/bpd.py`` asks for these where it runs and prepares.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latticedraft.decoding.drafters import file_of
from latticedraft.decoding.runs.loaders import default_model_dir
from latticedraft.paths import data_dir

AUTO_DRAFT_VOCAB = 1024  # V' of the bundled heads: 80% of corpus tokens, projection 8x cheaper
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
        return build() if fresh else session.learned.source("draft_model", (spec.gamma, spec.draft_confidence), build)
    lm = session.lm if file_of(spec.name) == "lm" else None
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
    """Acceptance rates for ``spec``'s drafts, fitted on the held-out calibration prompts
    (``CALIBRATION_PROMPTS`` of data/prompts.jsonl) and cached on disk per model and lattice
    settings; looked up once per session and spec."""
    return session.learned.acceptance(spec, lambda: _fit_acceptance(session, spec))


def _fit_acceptance(session, spec):
    from dataclasses import replace

    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.planning.acceptance import cached
    from latticedraft.decoding.planning.calibrate import calibrate
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.decoding.sources import sources

    file = data_dir() / "prompts.jsonl"
    recs = read_prompts(file)[CALIBRATION_PROMPTS] if file.is_file() else []
    fitted = [(s, s.build(session, getattr(spec, s.dest))) for s in sources() if s.on(spec) and s.rates == "fitted"]
    fitted = [(s, p) for s, p in fitted if p is not None]
    # without heads, a table of match lengths alone is not worth a calibration decode: its prior serves
    if not recs or spec.name in ("oracle", "model") or (
            spec.name == "none" and not any(s.bins == "probability" for s, _ in fitted)):
        return None  # the planner falls back to the uncalibrated prior
    key = acceptance_key(session, spec, [s for s, _ in fitted], [r["prompt"] for r in recs])
    calib = replace(spec.drafter_only(), tree="fixed")

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

        return calibrate(decode, ids, sources=tuple((s.name, p, s.bins) for s, p in fitted))

    return cached(key, build, report=session.learned.event)


def acceptance_key(session, spec, fitted: list, prompts: list[str]) -> dict:
    """What fitted rates depend on: the weights' files and the dtype they run in (a bfloat16
    verifier rounds its argmax differently), the lattice settings, the fitted sources (each
    one's value and the files it reads) and the prompts."""
    weights = [p for p in Path(session.base_dir).glob("*.safetensors")]
    if session.model_dir is not None or default_model_dir().exists():
        weights += list(Path(session.model_dir or default_model_dir()).glob("*.safetensors"))
    return {"weights": sorted((str(w.resolve()), w.stat().st_size, w.stat().st_mtime_ns) for w in weights),
            "dtype": str(next(session.model.parameters()).dtype),
            "spec": spec.acceptance_key(),
            "sources": {s.name: {"value": getattr(spec, s.dest), **({"lm": str(session.lm.build_dir.resolve()),
                                                                     "built": session.lm.manifest.get("built_at")}
                                                                    if "lm" in s.files else {})} for s in fitted},
            "prompts": prompts}


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
