"""Loading the bundled defaults and running a decode method on texts: what ``decode``,
``eval``, ``tune``, ``demo`` and the benchmark share.

Defaults (``latticedraft.paths``): model ``data/heads-stern`` (Stern heads on ``data/base``),
tokenizer ``data/tokenizer/tokenizer.json``, n-gram LM ``.cache/lm/stdlib-4gram``, neural
rescorer ``data/rescorer-small``. Methods: ``bpd`` (blockwise parallel decoding with a
drafter; lossless speculative sampling with ``sampling``), ``greedy`` (plain autoregressive
decoding, the baseline), ``lookahead`` (lookahead decoding, ``lookahead.py``), ``mtad``
(multi-token assisted decoding with an auxiliary draft model, ``mtad.py``; approximate),
``kangaroo`` (early-exit self-drafting with an adapter, ``kangaroo.py``) and ``ppd``
(predictive pipelined decoding, ``ppd.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from latticedraft.errors import InputError
from latticedraft.paths import data_dir, default_lm_dir

METHODS = ("bpd", "greedy", "lookahead", "mtad", "kangaroo", "ppd")
CALIBRATION_PROMPTS = slice(30, 42)  # the tuning split (Appendix E): never in the benchmark or eval prompts
AUTO_DRAFT_VOCAB = 1024  # V' of the bundled heads: 80% of corpus tokens, projection 8x cheaper
FAST = {"tree": "auto", "context_ngrams": 3, "draft_vocab": "auto"}  # fastest in benchmarks/decode.py
EOS_TEXT = "<|endoftext|>"


def default_model_dir() -> Path:
    return data_dir() / "heads-stern"


def default_rescorer_dir() -> Path:
    return data_dir() / "rescorer-small"


def load_model(model_dir=None, device=None, dtype=None):
    """A ``BlockwiseModel`` from a head checkpoint, or a plain HF causal LM directory (then BPD
    has no heads and decodes one token per call)."""
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.models.blockwise import CONFIG_NAME, BlockwiseModel

    path = Path(model_dir) if model_dir is not None else default_model_dir()
    if not path.exists():
        hint = " (the bundled heads: run `bash scripts/setup.sh` or `bash data/build.sh heads-stern`)" if model_dir is None else ""
        raise InputError(f"model directory {path} does not exist{hint}; pass --model DIR")
    if (path / CONFIG_NAME).is_file():
        return BlockwiseModel.from_pretrained(path, device=device, dtype=dtype)
    return hf.load_causal_lm(path, device=device, dtype=dtype)


def base_dir_of(model, model_dir=None) -> str:
    """The directory ``AutoModelForCausalLM.from_pretrained`` loads the base model from."""
    ref = getattr(model, "base_ref", None)
    if ref:
        return str(ref)
    return str(Path(model_dir) if model_dir is not None else default_model_dir())


def load_tokenizer_for(model, model_dir=None, tokenizer_path=None):
    """The given tokenizer, else one beside the model/base, else the bundled one; checked
    against the model's vocabulary."""
    from latticedraft.gpu.models.hf import check_tokenizer_fits
    from latticedraft.lm.tokenizer import load_tokenizer

    if tokenizer_path is not None:
        path = Path(tokenizer_path)
    else:
        cands = [Path(model_dir) / "tokenizer.json" if model_dir else None,
                 Path(model.base_ref) / "tokenizer.json" if getattr(model, "base_ref", None) else None,
                 data_dir() / "tokenizer" / "tokenizer.json"]
        path = next((c for c in cands if c is not None and c.is_file()), None)
        if path is None:
            raise InputError("no tokenizer beside the model or in data/tokenizer; pass --tokenizer PATH")
    tok = load_tokenizer(path)
    check_tokenizer_fits(tok, getattr(model, "base", model), where=str(model_dir or "the model"))
    if tokenizer_path is not None:
        from latticedraft.decoding.runs.tokenizer_check import check_model_tokenizer

        check_model_tokenizer(tok, path, model_dir or default_model_dir(), getattr(model, "base_ref", None))
    return tok


def load_lm(lm_dir=None, tokenizer=None):
    """The n-gram LM build (``NgramLM``); default: the bundled 4-gram that set-up builds."""
    from latticedraft.lm.ngram import NgramLM

    path = Path(lm_dir) if lm_dir is not None else default_lm_dir()
    if not path.exists():
        raise InputError(f"n-gram LM {path} not found; run `bash scripts/setup.sh` (builds the bundled 4-gram) "
                         "or pass --lm DIR from `latticedraft lm build`")
    return NgramLM.load(path, tokenizer=tokenizer)


def load_rescorer(path=None, device=None, tokenizer=None):
    """A small causal LM for neural rescoring (default ``data/rescorer-small``)."""
    from latticedraft.gpu.models import hf

    p = Path(path) if path is not None else default_rescorer_dir()
    if not p.exists():
        raise InputError(f"neural rescorer {p} not found; pass --rescorer DIR (a causal LM with the model's vocabulary)")
    m = hf.load_causal_lm(p, device=device)
    if tokenizer is not None:
        hf.check_tokenizer_fits(tokenizer, m, where=str(p))
    return m.eval()


def load_draft_model(path, target, device=None, tokenizer=None):
    """The auxiliary draft model of ``--drafter model`` and ``--method mtad``: a causal LM whose
    vocabulary is the target's (same size, and the tokenizer fits it); refused otherwise."""
    from latticedraft.gpu.models import hf

    if path is None:
        raise InputError("--drafter model and --method mtad need an auxiliary draft model: pass --draft-model DIR "
                         "(e.g. data/rescorer-medium, a causal LM with the target's tokenizer)")
    p = Path(path)
    if not p.exists():
        raise InputError(f"--draft-model {p} does not exist; pass a causal LM directory with the target's tokenizer")
    m = hf.load_causal_lm(p, device=device).eval()
    want, got = hf.model_vocab_size(getattr(target, "base", target)), hf.model_vocab_size(m)
    if want != got:
        raise InputError(f"--draft-model {p} has a vocabulary of {got} tokens, the target {want}; the draft model "
                         "must share the target's tokenizer")
    if tokenizer is not None:
        hf.check_tokenizer_fits(tokenizer, m, where=str(p))
        tok_file = p / "tokenizer.json"
        if tok_file.is_file():
            from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

            if fingerprint(load_tokenizer(tok_file)) != fingerprint(tokenizer):
                raise InputError(f"--draft-model {p} ships a tokenizer.json different from the target's; the draft "
                                 "model must share the target's tokenizer")
    return m


def read_prompts(path, limit: int | None = None) -> list[dict]:
    """JSONL records with ``prompt`` (str) and optional ``reference``; InputError names the line."""
    from latticedraft.textin import read_text_arg

    p = Path(path) if str(path) != "-" else "standard input"
    text = read_text_arg(path, "prompt file", 'pass --prompts FILE.jsonl with one {"prompt": ...} per line')
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
                raise KeyError("prompt")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise InputError(f"{p} line {i} is not a JSON object with a non-empty string 'prompt' ({e}); fix that line") from e
        out.append(rec)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InputError(f"prompt file {p} holds no prompts")
    return out


def encode(tokenizer, texts: list[str]) -> list[np.ndarray]:
    ids = [np.asarray(tokenizer.encode(t).ids, dtype=np.int64) for t in texts]
    for t, i in zip(texts, ids):
        if len(i) == 0:
            raise InputError(f"prompt {t!r} encodes to no tokens; give a non-empty prompt")
    return ids


def eos_id(tokenizer) -> int | None:
    return tokenizer.token_to_id(EOS_TEXT)


@dataclass
class DrafterSpec:
    """What ``make_drafter`` and the draft tree need, as plain values (CLI flags map 1:1).

    tree: "fixed" (verify every drafted path) or "auto" (cost-aware tree, ``draft_tree.py``);
    context_ngrams: longest context suffix matched for extra draft paths (0: off);
    draft_vocab: V', the number of most frequent tokens the heads project onto (None: all;
    "auto": ``AUTO_DRAFT_VOCAB`` where the heads ship ``draft_vocab.json``, else all).
    The defaults are the paper's drafters as published (the eval tables); ``fast()`` gives the
    fastest measured settings (benchmarks/decode.py), the CLI's and the demo's defaults."""

    name: str = "top1"
    k: int = 16
    prune: str = "none"
    eps: float = 0.001
    backoff: float | None = None
    slots: int | None = None
    alpha: float = 1.0
    nbest: int = 16
    tree: str = "fixed"
    context_ngrams: int = 0
    draft_vocab: int | str | None = None
    lookahead: object = None  # LookaheadOptions: a Jacobi window + n-gram pool as one more path source
    gamma: int = 4  # tokens the auxiliary draft model drafts per step (--drafter model)

    def for_sampling(self) -> "DrafterSpec":
        """This drafter as lossless sampling verifies it: every drafted path as drawn (no
        cost-aware tree, context n-grams or lookahead pool: choices that look at the drafted
        tokens would bias them)."""
        return replace(self, tree="fixed", context_ngrams=0, lookahead=None)

    def fast(self) -> "DrafterSpec":
        """This drafter with the fastest measured tree, context and vocabulary settings."""
        return replace(self, **FAST)

    def context(self):
        from latticedraft.decoding.proposers.context import ContextNgrams

        return ContextNgrams(max_ngram=self.context_ngrams) if self.context_ngrams else None


def build_drafter(spec: DrafterSpec, lm=None, rescorer=None, references=None, draft_model=None):
    """The drafter of ``spec``; None for "none" (no head drafts: context n-grams only, or greedy)."""
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter

    if spec.name == "none":
        return None
    opts = LatticeOptions(k=spec.k, prune=spec.prune, eps=spec.eps, backoff=spec.backoff, slots=spec.slots)
    return make_drafter(spec.name, options=opts, lm=lm, rescorer=rescorer, alpha=spec.alpha, nbest=spec.nbest,
                        references=references, draft_model=draft_model, gamma=spec.gamma)


def run_method(method: str, model, prompt_ids: list, drafter=None, *, max_new_tokens=64, eos_token_id=None,
               verify="auto", batch_size: int = 1, on_tokens=None, record_steps=False, tree_kw: dict | None = None,
               lookahead=None, sampling=None, first_row: int = 0, mtad=None, self_draft=None):
    """Decode ``prompt_ids`` with ``method`` in batches; returns one merged ``DecodeResult``.
    tree_kw: ``bpd_decode``'s tree, context, acceptance and draft_vocab arguments;
    lookahead: ``LookaheadOptions`` of ``--method lookahead`` (None: the paper's defaults);
    sampling: ``SamplingOptions`` (None: greedy; bpd and lookahead sample losslessly with it,
    mtad needs it); first_row: the index of ``prompt_ids[0]`` in the whole prompt set (row r's
    window and draws are seeded with it); mtad: (``MtadChooser``, ``MtadDrafter``) of
    ``--method mtad``; self_draft: (``KangarooOptions``, adapter) or (``PPDOptions``, early-exit
    heads or None) for ``kangaroo`` / ``ppd`` (``Session.self_draft`` loads them)."""
    from latticedraft.decoding.loop import DecodeResult, bpd_decode, greedy_decode
    from latticedraft.decoding.proposers.lookahead import LookaheadOptions, lookahead_decode
    from latticedraft.decoding.runs.prompt_length import fit_prompts

    if method not in METHODS:
        raise InputError(f"--method {method!r} is not one of {', '.join(METHODS)} (dynamo: see `decode --method dynamo`)")
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    fit_prompts(model, prompt_ids, max_new_tokens)  # every prompt, before the first batch runs
    parts = []
    for s in range(0, len(prompt_ids), batch_size):
        chunk = prompt_ids[s : s + batch_size]
        cb = None if on_tokens is None else (lambda i, t, s=s: on_tokens(s + i, t))
        if method == "greedy":
            r = greedy_decode(model, chunk, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
            if cb is not None:
                for i, q in enumerate(r.sequences):
                    cb(i, q.tokens.tolist())
        elif method == "lookahead":
            o = lookahead or LookaheadOptions()
            r = lookahead_decode(model, chunk, W=o.W, N=o.N, G=o.G, prompt_as_reference=o.prompt_as_reference,
                                 seed=o.seed, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                                 verify=verify, on_tokens=cb, first_row=first_row + s, sampling=sampling)
        elif method == "mtad":
            chooser, mtad_drafter = mtad
            r = bpd_decode(model, chunk, mtad_drafter, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                           verify=verify, on_tokens=cb, first_row=first_row + s, sampling=sampling, chooser=chooser)
        elif method == "kangaroo":
            o, adapter = self_draft
            from latticedraft.decoding.proposers.kangaroo import kangaroo_decode

            r = kangaroo_decode(model, chunk, adapter, gamma=o.gamma, eta=o.eta, max_new_tokens=max_new_tokens,
                                eos_token_id=eos_token_id, on_tokens=cb)
        elif method == "ppd":
            o, heads = self_draft
            from latticedraft.decoding.self_draft.ppd import ppd_decode

            r = ppd_decode(model, chunk, dbar=o.dbar, k=o.k, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                           on_tokens=cb, exit_head=heads)
        else:  # sampling rows are numbered over the prompt set (seeds); the oracle's references per call
            r = bpd_decode(model, chunk, drafter, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                           verify=verify, on_tokens=cb, record_steps=record_steps,
                           first_row=s if sampling is None else first_row + s, sampling=sampling, **(tree_kw or {}))
            for st in r.steps:
                st.row += s
        parts.append(r)
    timing = {k: sum(p.timing.get(k, 0.0) for p in parts) for k in parts[0].timing}
    return DecodeResult(
        [q for p in parts for q in p.sequences], parts[0].verify_mode, parts[0].verify_reason,
        sum(p.seconds for p in parts), timing, [st for p in parts for st in p.steps],
    )


def records(result, tokenizer, model_dir: str, texts: list[str]) -> list[dict]:
    """The ``--json`` objects, one per prompt."""
    out = []
    for text, s in zip(texts, result.sequences):
        out.append({
            "prompt": text,
            "prompt_ids": s.prompt_ids.tolist(),
            "tokens": s.tokens.tolist(),
            "text": tokenizer.decode(s.tokens.tolist()),
            "calls": s.calls,
            "block_efficiency": round(s.block_efficiency, 4),
            "accepted_per_step": s.accepted_drafts,
            "tree_nodes_per_step": s.tree_nodes,
            "heads_per_step": s.heads_per_step,
            "tokens_per_call": s.tokens_per_call,
            "seconds": round(s.seconds, 4),
            "verify": result.verify_mode,
            "model": model_dir,
        })
    return out


class TextStream:
    """Prints tokens as text while they arrive (byte-level BPE: decode the whole row each
    time and print the new suffix, so multi-byte characters never split)."""

    def __init__(self, tokenizer, file):
        self.tok, self.file, self.ids, self.shown = tokenizer, file, [], ""

    def __call__(self, row: int, new: list[int]) -> None:
        self.ids.extend(int(t) for t in new)
        text = self.tok.decode(self.ids)
        if text.startswith(self.shown):
            self.file.write(text[len(self.shown):])
            self.file.flush()
            self.shown = text


class Session:
    """The model, tokenizer and (loaded on first use) LM and rescorer of one command."""

    def __init__(self, model_dir=None, tokenizer_path=None, lm_dir=None, rescorer_dir=None, device=None,
                 threads: int | None = None, draft_model_dir=None):
        if threads is not None:
            if threads < 1:
                raise InputError(f"--threads must be >= 1, got {threads}")
            import torch

            torch.set_num_threads(threads)  # tiny models: per-op thread sync costs more than it saves
        self.model_dir = model_dir
        self.model = load_model(model_dir, device=device)
        self.tokenizer = load_tokenizer_for(self.model, model_dir, tokenizer_path)
        self.base_dir = base_dir_of(self.model, model_dir)
        self.lm_dir, self.rescorer_dir, self.device = lm_dir, rescorer_dir, device
        self.draft_model_dir = draft_model_dir
        self._lm = self._rescorer = self._draft_model = None
        self._memo: dict = {}  # (what, key) -> the session's gates, draft vocabularies, acceptance rates
        self.notify = None  # notify(message): one-time work worth telling a user about (the CLI: stderr)
        self.eos = eos_id(self.tokenizer)

    @property
    def lm(self):
        if self._lm is None:
            self._lm = load_lm(self.lm_dir, self.tokenizer)
        return self._lm

    @property
    def rescorer(self):
        if self._rescorer is None:
            self._rescorer = load_rescorer(self.rescorer_dir, self.device, self.tokenizer)
        return self._rescorer

    @property
    def draft_model(self):
        """The auxiliary draft model (``--draft-model DIR``), checked against the target."""
        if self._draft_model is None:
            self._draft_model = load_draft_model(self.draft_model_dir, self.model, self.device, self.tokenizer)
        return self._draft_model

    def prepare(self, spec: DrafterSpec, batch_size: int = 1) -> None:
        """Load what ``spec`` needs now, so that a missing LM or rescorer fails before any output
        and the first decode step does not pay for building search tables or loading kernels."""
        if spec.name in ("ngram", "parallel"):
            from latticedraft.lattice.lm_tables import lm_arrays
            from latticedraft.lattice.search import warm_up

            lm_arrays(self.lm.fst)
            warm_up(int(self.lm.fst.order))
        if spec.name == "neural":
            _ = self.rescorer
        if spec.name == "model":
            _ = self.draft_model
        self.draft_vocab(spec.draft_vocab)  # a missing or bad draft_vocab.json fails here
        spec.context()
        if spec.tree == "auto" and spec.name != "oracle":  # (the oracle's references come per call)
            # measure T(n) and fit the acceptance rates now (both cached on disk after the first
            # run), so that streaming output and timings never include them
            warm = np.asarray(self.tokenizer.encode("import os\n").ids, dtype=np.int64)
            self.decode([warm] * batch_size, "bpd", spec, max_new_tokens=2, batch_size=batch_size)

    def drafter(self, spec: DrafterSpec, references=None):
        lm = self.lm if spec.name in ("ngram", "parallel") else None
        rescorer = self.rescorer if spec.name == "neural" else None
        draft = self.draft_model if spec.name == "model" else None
        return build_drafter(spec, lm=lm, rescorer=rescorer, references=references, draft_model=draft)

    def decode(self, prompt_ids: list, method: str = "bpd", spec: DrafterSpec | None = None, *,
               max_new_tokens: int = 64, verify: str = "auto", batch_size: int = 1, on_tokens=None,
               references=None, record_steps: bool = False, lookahead=None, sampling=None, first_row: int = 0,
               mtad=None, self_draft=None):
        """Decode token-id prompts; the oracle drafter gets greedy references computed here
        unless given. lookahead: ``LookaheadOptions`` for ``method="lookahead"``; sampling:
        ``SamplingOptions`` (None: greedy) for bpd (lossless speculative sampling; ``spec`` is
        verified as ``spec.for_sampling()``), lookahead and mtad (default: the paper's top-20,
        top-p 0.9); mtad: ``MtadOptions``; first_row: index of prompt_ids[0] in the prompt set;
        self_draft: ``KangarooOptions`` / ``PPDOptions`` for those methods (None: their defaults)."""
        spec = spec or DrafterSpec()
        drafter, tree_kw, mtad_pair = None, None, None
        if method == "mtad":
            from latticedraft.decoding.proposers.mtad import MTAD_SAMPLING, MtadChooser, MtadDrafter, MtadOptions

            o = mtad or MtadOptions()
            sampling = sampling or MTAD_SAMPLING
            mtad_pair = (MtadChooser(sampling, o.tau), MtadDrafter(self.draft_model, o.gamma, o.beams))
        if method == "bpd" and sampling is not None:
            if spec.name == "oracle":
                raise InputError("--drafter oracle drafts the greedy output; it has nothing to offer sampling "
                                 "(choose another drafter)")
            spec = spec.for_sampling()
        if method == "bpd":
            if spec.name == "oracle" and references is None:
                g = run_method("greedy", self.model, prompt_ids, max_new_tokens=max_new_tokens, eos_token_id=self.eos)
                references = [q.tokens for q in g.sequences]
            drafter = self.drafter(spec, references)
            vocab = self.draft_vocab(spec.draft_vocab)
            tree_kw = {"tree": spec.tree, "context": spec.context(), "draft_vocab": vocab, "lookahead": spec.lookahead,
                       "acceptance": self.acceptance(spec) if spec.tree == "auto" else None,
                       "gate": self.gate(spec)}
        return run_method(method, self.model, prompt_ids, drafter, max_new_tokens=max_new_tokens,
                          eos_token_id=self.eos, verify=verify, batch_size=batch_size, on_tokens=on_tokens,
                          record_steps=record_steps, tree_kw=tree_kw, lookahead=lookahead, sampling=sampling,
                          first_row=first_row, mtad=mtad_pair,
                          self_draft=self.self_draft(method, self_draft) if method in ("kangaroo", "ppd") else None)

    def self_draft(self, method: str, opts=None):
        """(options, module) for ``kangaroo`` (the adapter; default ``data/adapter-kangaroo``) or
        ``ppd`` (the early-exit heads, or None for the shared LM head); loaded once per session."""
        from latticedraft.gpu.verify.layer_split import LayerSplit

        if method == "kangaroo":
            from latticedraft.decoding.proposers.kangaroo import KangarooOptions
            from latticedraft.gpu.models.adapter import load_adapter

            o = opts or KangarooOptions()
            where = Path(o.adapter) if o.adapter else data_dir() / "adapter-kangaroo"
            return o, self._once(("adapter", str(where)), lambda: load_adapter(where, LayerSplit(self.model)))
        from latticedraft.decoding.self_draft.ppd import PPDOptions

        o = opts or PPDOptions()
        if o.exit_heads is None:
            return o, None
        from latticedraft.gpu.models.exit_heads import load_exit_heads

        return o, self._once(("exit_heads", o.exit_heads), lambda: load_exit_heads(o.exit_heads, LayerSplit(self.model)))

    def gate(self, spec: DrafterSpec):
        """The ``HeadGate`` of ``spec`` for this session: what it measured carries over between
        calls (a command decodes its prompts one call at a time)."""
        from latticedraft.decoding.planning.head_gate import HeadGate

        return self._once(("gate", repr(spec)), HeadGate)

    def _once(self, key, build):
        """``build()`` the first time ``key`` is asked for in this session, the same object after."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def draft_vocab(self, size: int | str | None):
        """The ``size`` most frequent token ids of the heads' training corpus (int64[size]),
        from ``draft_vocab.json`` beside the head checkpoint; None for None (and for "auto"
        where the checkpoint has no ranking, or a plain causal LM without heads)."""
        from latticedraft.decoding.planning.draft_vocab import FILE, load_ranked

        where = Path(self.model_dir) if self.model_dir is not None else default_model_dir()
        if size == "auto":
            usable = getattr(self.model, "num_heads", 1) > 1 and (where / FILE).is_file()
            size = AUTO_DRAFT_VOCAB if usable else None
        if size is None:
            return None
        return self._once(("draft_vocab", str(where), int(size)), lambda: load_ranked(where, int(size)))

    def acceptance(self, spec: DrafterSpec):
        """Acceptance rates for ``spec``'s drafts, fitted on the held-out calibration prompts
        (``CALIBRATION_PROMPTS`` of data/prompts.jsonl) and cached on disk per model and lattice
        settings; looked up once per session and spec."""
        return self._once(("acceptance", repr(spec)), lambda: self._fit_acceptance(spec))

    def _fit_acceptance(self, spec: DrafterSpec):
        from latticedraft.decoding.planning import acceptance
        from latticedraft.decoding.planning.calibrate import calibrate

        file = data_dir() / "prompts.jsonl"
        recs = read_prompts(file)[CALIBRATION_PROMPTS] if file.is_file() else []
        if not recs or spec.name == "oracle":
            return None  # the planner falls back to the uncalibrated prior (the oracle needs no rates)
        weights = [p for p in Path(self.base_dir).glob("*.safetensors")]
        if self.model_dir is not None or default_model_dir().exists():
            weights += list(Path(self.model_dir or default_model_dir()).glob("*.safetensors"))
        key = {"weights": sorted((str(w.resolve()), w.stat().st_size, w.stat().st_mtime_ns) for w in weights),
               "spec": {k: getattr(spec, k) for k in ("name", "k", "prune", "eps", "backoff", "slots", "alpha", "nbest",
                                                       "context_ngrams", "draft_vocab")},
               "prompts": [r["prompt"] for r in recs]}
        calib = DrafterSpec(**{**spec.__dict__, "tree": "fixed", "context_ngrams": 0})

        def build():
            if self.notify:
                self.notify(f"--tree auto: fitting acceptance rates for --drafter {spec.name} on {len(recs)} held-out "
                            "prompts (once; cached under .cache/acceptance)")
            ids = encode(self.tokenizer, [r["prompt"] for r in recs])
            return calibrate(self.model, self.drafter(calib), ids, context=spec.context(),
                             draft_vocab=self.draft_vocab(spec.draft_vocab), eos_token_id=self.eos)

        return acceptance.cached(key, build)
