"""Blockwise parallel decoding (``--method bpd``): the heads' drafts on the one decode loop.

A BPD decode composes proposers for ``loop.speculative_decode``: the heads' lattice drafter
(``proposers/heads.py``: top1, neural, ngram, parallel, parallel-base, oracle) or an auxiliary
draft model (``--drafter model``), plus the draft sources the options turn on (``decoding/sources.py``:
each registered once, with its own option) and a lookahead window + pool; the draft tree is
fixed (every path) or cost-aware (``--tree auto``), with the head gate where context n-grams can
carry a step alone. With ``sampling`` the same: every drafter drafts under the run's Gumbel noise
and verification keeps what equals the target's perturbed argmax (``accept/sampling.py``), so
every choice greedy decoding makes is lossless there too.

``DrafterSpec`` holds the drafting options as plain values and declares their flags (the
sources' fields come from their declarations); ``METHOD`` is the registry entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, make_dataclass, replace

import numpy as np

from latticedraft.decoding.methods.lookahead import DESTS as LOOKAHEAD_DESTS
from latticedraft.decoding.drafters import HEADS as HEAD_DRAFTERS
from latticedraft.decoding.drafters import NAMES as DRAFTERS
from latticedraft.decoding.drafters import file_of, help_text, reading
from latticedraft.decoding.methods.bpd_session import AUTO_DRAFT_VOCAB
from latticedraft.decoding.registry import Method, Request, cli_defaults, flags, option, sampling_label
from latticedraft.decoding import sources as draft_sources
from latticedraft.decoding.runs.loaders import DRAFT_MODEL_HINT, plain_model
from latticedraft.errors import InputError

LM_READERS = reading("lm")
# which drafters read the options _Drafting does not declare (its own declare ``only``): their
# files but the LM (which LM drafts read too: refused in ``_configure``), and the draft model's --gamma
FILE_OPTIONS = {"rescorer": reading("rescorer"), "draft_model": reading("draft_model"), "gamma": ("model",)}
LOOKAHEAD_POOL = (*LOOKAHEAD_DESTS, "lookahead_config")  # what --lookahead-pool reads

# why batched verification runs the fixed tree: its step costs rows x depth, which T(n) of n tree nodes
# does not model, and measuring T(n) alone costs ~100 verify calls before the first token
BATCHED_TREE = ("batched verification runs every drafted path as a row over its own copy of the cache, so "
                "the cost-aware tree's T(n) does not model it; it verifies the fixed set of paths")


@dataclass
class _Drafting:
    """What the drafter and the draft tree need, as plain values; each field that is a command-line
    option declares it (``registry.option``: flag, help, group, the CLI's default), from which the
    ``decode`` / ``eval`` parsers, ``FAST``, ``custom_generate``'s defaults and the acceptance rates'
    cache key are made. ``DrafterSpec`` is this class with one more field per registered draft
    source (``sources.spec_fields``: the source's option).

    A ``DrafterSpec(...)`` built directly is the paper's drafter as published (what the eval tables
    ask for by constructing it); ``fast()`` gives the fastest measured settings
    (benchmarks/decode.py), which every options object made from option values starts from:
    ``METHOD.configure``, so the CLI, ``Session.configure`` / ``Session.decode`` and
    ``custom_generate`` decode alike.
    ``lookahead``: ``LookaheadOptions`` of a Jacobi window + n-gram pool riding along
    (``--lookahead-pool``); ``gamma``: tokens the auxiliary draft model drafts per step."""

    name: str = option("top1", group="drafting", flag="--drafter", choices=DRAFTERS, help=help_text())
    k: int = option(16, group="drafting", only=HEAD_DRAFTERS, type=int, help="candidates per head in the lattice")
    prune: str = option("none", group="drafting", only=HEAD_DRAFTERS, choices=["none", "static", "otsu"],
                        help="lattice pruning")
    eps: float = option(0.001, group="drafting", only=HEAD_DRAFTERS, type=float,
                        help="static pruning threshold, a probability")
    backoff: float | None = option(None, group="drafting", only=HEAD_DRAFTERS, type=float, metavar="EPS_B",
                                   help="cut the lattice at the first head whose best probability is below EPS_B")
    slots: int | None = option(None, group="drafting", only=HEAD_DRAFTERS, type=int, metavar="D",
                               help="draft from the first D extra heads only; the others are not computed "
                                    "(default: all; 2 under --do-sample)")
    alpha: float | None = option(1.0, group="drafting", only=("ngram", "parallel", "neural"), type=float, help=(
        "interpolation weight of the rescoring LM (default: --drafter ngram / parallel learn it while decoding, "
        "within [0, 2], from what the target keeps of each ranking, and keep it in the cache; otherwise 1.0)"))
    nbest: int = option(16, group="drafting", only=("parallel", "parallel-base"), type=int,
                        help="drafts verified per step for parallel drafters")
    tree: str = option("fixed", cli="auto", fit=False, group="tree", choices=["auto", "fixed"], help=(
        "auto: verify the nodes that maximise expected tokens per second under the measured step cost T(n); "
        "fixed: every drafted path (the default under --do-sample)"))
    draft_vocab: int | str | None = option(None, cli="auto", group="tree", only=HEAD_DRAFTERS, metavar="V", help=(
        "the extra heads project onto the V most frequent tokens (draft_vocab.json beside the heads); 0 = the full "
        f"vocabulary; verification always uses all (default auto: {AUTO_DRAFT_VOCAB} where the heads ship a "
        "ranking, else all)"))
    lookahead: object = None
    gamma: int = 4
    draft_confidence: float = option(0.2, group="drafting", only=("model",), type=float, metavar="P", help=(
        "--drafter model: stop drafting once the chance that the whole draft is accepted falls below P (each "
        "token's chance: its draft probability, calibrated on what the target accepted so far; 0 = always --gamma "
        "tokens)"))

    def fast(self) -> "DrafterSpec":
        """This drafter with the fastest measured tree, context and vocabulary settings."""
        return replace(self, **FAST)

    def acceptance_key(self) -> dict:
        """The settings the acceptance rates fitted for this drafter depend on: every declared
        option but those marked ``fit=False`` (the tree, and LM drafts, which are keyed by their LM)."""
        return {f.name: getattr(self, f.name) for _, f, fl in flags(DrafterSpec) if fl.fit}

    def drafter_only(self) -> "DrafterSpec":
        """This drafter with every draft source off (and no lookahead pool)."""
        return replace(self, lookahead=None, **{s.dest: 0 for s in draft_sources.sources()})

    def lattice_options(self):
        from latticedraft.decoding.proposers.heads import LatticeOptions

        return LatticeOptions(k=self.k, prune=self.prune, eps=self.eps, backoff=self.backoff, slots=self.slots)


DrafterSpec = make_dataclass("DrafterSpec", draft_sources.spec_fields(), bases=(_Drafting,))
DrafterSpec.__doc__ = _Drafting.__doc__
DrafterSpec.__module__ = __name__

FAST = cli_defaults(DrafterSpec)  # the CLI's defaults where they differ: the fastest in benchmarks/decode.py


# ---------------------------------------------------------------------------------------------- registry


def _configure(values: dict, given: set) -> DrafterSpec:
    """The ``DrafterSpec`` of option values (dest -> value); a missing value takes the CLI's default,
    so ``Session.configure`` and ``custom_generate`` decode as ``latticedraft decode`` does."""
    values = {**cli_defaults(DrafterSpec, changed_only=False, by_dest=True),
              **{k: v for k, v in values.items() if v is not None}}
    name = values["drafter"]
    if name not in DRAFTERS:
        raise InputError(f"--drafter {name!r} is not one of {', '.join(DRAFTERS)}")
    only = {**FILE_OPTIONS, **{dest: fl.only for dest, _, fl in flags(DrafterSpec) if fl.only}}
    for dest, users in only.items():
        if dest in given and name not in users:
            raise InputError(f"--{dest.replace('_', '-')} does not apply to --drafter {name} (it applies to "
                             f"--drafter {' / '.join(users)}); drop it")
    on = draft_sources.checked(values)  # each source's value, range-checked by its own declaration
    if "lm" in given and name not in LM_READERS and not any(
            "lm" in s.files and s.is_on(on[s.dest]) for s in draft_sources.sources()):
        readers = [s.flag for s in draft_sources.sources() if "lm" in s.files]
        raise InputError(f"--lm does not apply to --drafter {name} without {' / '.join(readers)} (it applies to "
                         f"--drafter {' / '.join(LM_READERS)} and to those sources); drop it")
    declared = {f.name: values[dest] for dest, f, _ in flags(DrafterSpec)}
    tree = _batched_verification(values, given, on, declared["tree"])
    if name in LM_READERS and "alpha" not in given:
        declared["alpha"] = None  # learned as it decodes (planning/rescore_weight.py)
    spec = DrafterSpec(**{**declared, **on, "name": name, "tree": tree, "draft_vocab": _draft_vocab(values["draft_vocab"])},
                       lookahead=_lookahead(values, given),
                       gamma=DrafterSpec.gamma if values.get("gamma") is None else values["gamma"])
    _check_ranges(spec, values, given)
    if values.get("do_sample"):
        if spec.name == "oracle":
            raise InputError("--drafter oracle drafts the greedy output; it has nothing to offer sampling "
                             "(choose another drafter)")
        if spec.name in HEAD_DRAFTERS and plain_model(values.get("model")):
            if "drafter" in given:
                raise InputError(f"--drafter {name} drafts from multi-token heads, and --model {values.get('model')} "
                                 "has none (no heads_config.json), so it would draft nothing; use --drafter none "
                                 "(context and LM n-grams) or a head directory built for this model")
            spec = replace(spec, name="none")  # the default drafter on a plain model: the n-grams, as in greedy
        spec = _sampled_defaults(spec, given)
    return spec


SAMPLED_SLOTS = 2  # heads drafted under sampling where --slots is not given


def _sampled_defaults(spec: DrafterSpec, given: set) -> DrafterSpec:
    """Under ``--do-sample``, what is not given drafts less: the first SAMPLED_SLOTS heads, each
    source at its ``sampled_default`` (LM drafts off), every drafted path verified (``--tree fixed``). A sampled token matches a draft less
    often than a greedy one, so deep drafts, extra sources and tree planning cost more than they
    return (bundled model, 8 held-back code prompts: 0.73x HF sampling with the greedy defaults,
    1.08x with these; docs/sampling.md)."""
    changes = {}
    if spec.name in HEAD_DRAFTERS and "slots" not in given:
        changes["slots"] = SAMPLED_SLOTS if spec.slots is None else min(spec.slots, SAMPLED_SLOTS)
    for src in draft_sources.sources():
        if src.sampled_default is not None and src.dest not in given:
            changes[src.dest] = src.sampled_default
    if "tree" not in given:
        changes["tree"] = "fixed"
    return replace(spec, **changes)


def _draft_vocab(vocab):
    """``--draft-vocab``: "auto", a number of tokens, or None (0: the full vocabulary)."""
    if vocab == "auto":
        return vocab
    try:
        vocab = int(vocab)
    except ValueError:
        raise InputError(f"--draft-vocab {vocab!r}: give a number of tokens (0 = full vocabulary) or auto") from None
    if vocab < 0:
        raise InputError(f"--draft-vocab {vocab}: give a number of tokens >= 1, 0 for the full vocabulary, or auto")
    return vocab or None


def _lookahead(values: dict, given: set):
    """The ``LookaheadOptions`` of ``--lookahead-pool`` (None without it; its options refused then)."""
    if not values.get("lookahead_pool"):
        for dest in LOOKAHEAD_POOL:
            if dest in given:
                raise InputError(f"--{dest.replace('_', '-')} does not apply to --method bpd unless --lookahead-pool "
                                 "runs a Jacobi window (or use --method lookahead); add --lookahead-pool or drop it")
        return None
    from latticedraft.decoding.methods.lookahead import options_from

    return options_from(values, given)


def _batched_verification(values: dict, given: set, on: dict, tree: str) -> str:
    """Under ``--verify batched``: sources that draft over the verifier's cache are off (refused
    where given), and the tree is fixed (refused where ``--tree auto`` is given); the tree policy."""
    if values.get("verify") != "batched":
        return tree
    for src in draft_sources.sources():
        if src.shares_cache and src.is_on(on[src.dest]):
            if src.dest in given:
                raise InputError(f"{src.flag} {on[src.dest]} does not apply to --verify batched: it drafts over the "
                                 f"verifier's own cache, which tree verification keeps; drop {src.flag} or --verify")
            on[src.dest] = src.option.default  # (the CLI's default under batched verification: off)
    if tree == "auto" and "tree" in given:
        raise InputError(f"--tree auto does not apply to --verify batched: {BATCHED_TREE}; drop --tree auto")
    return "fixed"


def _check_ranges(spec: DrafterSpec, values: dict, given: set) -> None:
    """The ranges of the drafting options, and what ``--drafter model`` needs."""
    from latticedraft.decoding.proposers.heads import LatticeOptions

    if spec.name in HEAD_DRAFTERS:
        LatticeOptions(spec.k, spec.prune, spec.eps, spec.backoff, spec.slots)  # the lattice options' ranges
    if spec.nbest < 1:
        raise InputError(f"--nbest {spec.nbest} must be >= 1")
    if spec.gamma < 1:
        raise InputError(f"--gamma {spec.gamma}: the draft model drafts at least 1 token per step")
    if not 0.0 <= spec.draft_confidence < 1.0:
        raise InputError(f"--draft-confidence {spec.draft_confidence}: give a probability in [0, 1) (0 = off)")
    if spec.alpha is not None and not (np.isfinite(spec.alpha) and spec.alpha >= 0):
        raise InputError(f"--alpha {spec.alpha} must be a finite number >= 0 (the weight of the rescoring LM)")
    if "eps" in given and spec.prune == "none":
        raise InputError("--eps applies to --prune static or otsu only; add --prune static or drop --eps")
    if spec.name == "model" and values.get("draft_model") is None:
        raise InputError(f"--drafter model needs an auxiliary draft model: {DRAFT_MODEL_HINT}")


def _label(spec: DrafterSpec, sampling) -> str:
    return f"bpd/{spec.name}" + sampling_label(sampling)


def _settings(spec: DrafterSpec, sampling) -> dict:
    s = {"drafter" if k == "name" else k: v for k, v in asdict(spec).items()}
    return {**s, "sampling": None if sampling is None else asdict(sampling)}


def _check(session, spec: DrafterSpec) -> None:
    """Before any LM table, draft model, T(n) or acceptance rate: the verifier can run this model."""
    from latticedraft.gpu.verify.modes import check_verifiable

    check_verifiable(session.model)


def _check_files(spec: DrafterSpec, files: dict, tokenizer=None) -> None:
    """Before the model loads (the CLI) or anything is built (``Session.check``): the n-gram LM where
    ``spec`` cannot decode without it, at the path its load resolves (``loaders.require_lm``): read by
    the drafter, or by a source at a value that needs it (not at its ``if_present`` values unless
    ``--lm`` names one: ``--lm-drafts auto`` is off without the default LM). files: file option dest
    -> the path given (None: the default); tokenizer: the session's (None before it loads)."""
    from latticedraft.decoding.runs.loaders import require_lm

    named = files.get("lm") is not None
    needs = [f"--drafter {spec.name}"] if file_of(spec.name) == "lm" else []
    plain = [d for d in HEAD_DRAFTERS if file_of(d) is None and d != "oracle"]  # top1, parallel-base
    avoid = [f"--drafter {' / '.join(plain)}"] if needs else []
    for s in draft_sources.sources():
        value = getattr(spec, s.dest)
        if "lm" in s.files and s.is_on(value) and (named or value not in s.if_present):
            needs.append(f"{s.flag} {value}")
            avoid.append(f"{s.flag} {s.option.default}")
    if needs:
        require_lm(files.get("lm"), tokenizer, fix=f", or decode without it (read by {' and '.join(needs)}): "
                                                   f"{' with '.join(avoid)}")


def _prepare(session, spec: DrafterSpec, batch_size: int) -> None:
    """Load and check what ``spec`` drafts from; with ``--tree auto`` also measure T(n) now (cached
    on disk after the first run) and read the stored acceptance counts, by decoding a warm-up
    prompt at batch 1 and at the run's batch size (between which a last, partial batch
    interpolates), so that streaming output and timings never include them. (The oracle's
    references come per call.)"""
    from latticedraft.decoding.methods import bpd_session

    bpd_session.load(session, spec)
    if spec.tree == "auto" and spec.name != "oracle":
        warm = np.asarray(session.tokenizer.encode("import os\n").ids, dtype=np.int64)
        for b in sorted({1, batch_size}):
            _run(session, [warm] * b, spec, Request(max_new_tokens=2, eos_token_id=session.eos), warm_up=True)


def _run(session, prompts: list, spec: DrafterSpec, req, warm_up: bool = False) -> object:
    """One decode call of ``spec``; ``warm_up``: with a new head gate, sources and draft-model
    proposer, so that the warm-up teaches neither the session's gate, the suffix drafts' memory,
    the draft model's calibration nor the acceptance counts. A greedy auto-tree decode records its
    steps and adds them to the acceptance counts (``bpd_session.count_steps``)."""
    from latticedraft.decoding.methods import bpd_session as ses
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.planning.head_gate import HeadGate

    refs = ses.references(session, prompts, req.max_new_tokens) if spec.name == "oracle" else None  # what it drafts
    learned = session.learned
    plan = BpdPlan(tree=spec.tree, acceptance=ses.acceptance(session, spec) if spec.tree == "auto" else None,
                   draft_vocab=ses.draft_vocab(session, spec.draft_vocab) if spec.name in HEAD_DRAFTERS else None,
                   gate=HeadGate() if warm_up else learned.gate(spec), lookahead=spec.lookahead,
                   sources=draft_sources.build_all(session, spec, fresh=warm_up),
                   correction=None if warm_up or spec.tree != "auto" else learned.correction(spec, req.sampling),
                   note=learned.event)
    count = not warm_up and ses.counting(session, spec, req.sampling)  # the session's steps teach the tables
    res = bpd_decode(session.model, prompts, ses.proposer(session, spec, refs, fresh=warm_up), plan,
                     replace(req, record_steps=True) if count else req)
    if count:
        ses.count_steps(session, spec, res)
        if not req.record_steps:
            res.steps = []
    if not warm_up and req.sampling is None and ses.learns_alpha(spec):
        ses.store_rescore_weight(session, spec)  # (what this call taught it, for the next sessions)
    return res


METHOD = Method(
    name="bpd",
    summary="blockwise parallel decoding: the heads' lattice (rescored or not) or a draft model, with the draft "
            "sources (context and LM n-grams, suffix drafts...) and a lookahead pool, verified in one tree per step; "
            "lossless",
    lossless=True,
    sampling="optional",
    options=(*(dest for dest, _, _ in flags(DrafterSpec)), "lm", "rescorer", "verify", "lookahead_pool", "draft_model",
             "gamma", *LOOKAHEAD_POOL),
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    check=_check,
    check_files=_check_files,
    continuous=lambda spec: spec.name in ("none", *HEAD_DRAFTERS) and spec.lookahead is None,
    files=lambda spec: tuple(dict.fromkeys(
        ([file_of(spec.name)] if file_of(spec.name) else [])
        + [f for s in draft_sources.sources() if s.on(spec) for f in s.files])),
)
