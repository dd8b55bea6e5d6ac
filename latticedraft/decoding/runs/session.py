"""A ``Session``: the model and tokenizer of one command, what its methods load on first use (the
n-gram LM, the neural rescorer, the draft model, adapters, co-occurrence counts, draft
vocabularies, acceptance rates, head gates), each once, and ``decode``: any registered method
(``decoding/registry.py``) over token-id prompts, in batches.

    >>> s = Session()                                     # doctest: +SKIP
    >>> spec = s.configure("bpd", {"drafter": "parallel", "nbest": 8})
    >>> s.prepare("bpd", spec)                            # loads, measures and checks before output
    >>> r = s.decode(encode(s.tokenizer, ["import os\\n"]), "bpd", spec, max_new_tokens=32)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latticedraft.decoding import registry
from latticedraft.decoding.runs.loaders import (base_dir_of, default_model_dir, end_ids, load_adapter_for,
                                                load_draft_model, load_exit_heads_for, load_lm, load_model,
                                                load_rescorer, load_tokenizer_for)
from latticedraft.errors import InputError
from latticedraft.paths import data_dir

CALIBRATION_PROMPTS = slice(30, 42)  # the tuning split (Appendix E): never in the benchmark or eval prompts


class Session:
    """model_dir: heads checkpoint or HF causal LM (default ``data/heads-stern``); tokenizer_path,
    lm_dir, rescorer_dir, draft_model_dir: as the CLI's options (None: defaults); threads: torch
    CPU threads (None: torch's choice); model: an already loaded model to decode with (a
    ``BlockwiseModel`` or an HF causal LM: ``custom_generate``'s) instead of loading ``model_dir``,
    which then names where its heads came from (``draft_vocab.json``, the tokenizer beside them)."""

    def __init__(self, model_dir=None, tokenizer_path=None, lm_dir=None, rescorer_dir=None, device=None,
                 threads: int | None = None, draft_model_dir=None, model=None):
        if threads is not None:
            if threads < 1:
                raise InputError(f"--threads must be >= 1, got {threads}")
            import torch

            torch.set_num_threads(threads)  # tiny models: per-op thread sync costs more than it saves
        self.model_dir = model_dir
        self.model = load_model(model_dir, device=device) if model is None else model
        self.tokenizer = load_tokenizer_for(self.model, model_dir, tokenizer_path)
        self.base_dir = base_dir_of(self.model, model_dir)
        self.lm_dir, self.rescorer_dir, self.device = lm_dir, rescorer_dir, device
        self.draft_model_dir = draft_model_dir
        self._memo: dict = {}  # (what, key) -> what the session loaded, measured or fitted once
        self.notify = None  # notify(message): one-time work worth telling a user about (the CLI: stderr)
        self.eos = end_ids(self.model, self.tokenizer)  # as generate: the generation config's end id(s)

    def _once(self, key, build):
        """``build()`` the first time ``key`` is asked for in this session, the same object after."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    # -- what methods load --------------------------------------------------------------------
    @property
    def lm(self):
        return self._once(("lm", self.lm_dir), lambda: load_lm(self.lm_dir, self.tokenizer))

    @property
    def rescorer(self):
        return self._once(("rescorer", self.rescorer_dir),
                          lambda: load_rescorer(self.rescorer_dir, self.device, self.tokenizer))

    @property
    def draft_model(self):
        """The auxiliary draft model (``--draft-model DIR``), checked against the target."""
        return self._once(("draft_model", self.draft_model_dir),
                          lambda: load_draft_model(self.draft_model_dir, self.model, self.device, self.tokenizer))

    def adapter(self, path=None):
        """Kangaroo's adapter (default ``data/adapter-kangaroo``), checked against the base."""
        return self._once(("adapter", str(path)), lambda: load_adapter_for(self.model, path))

    def exit_heads(self, path=None):
        """PPD's early-exit heads from ``path`` (None: the shared LM head)."""
        return self._once(("exit_heads", str(path)), lambda: load_exit_heads_for(self.model, path))

    def cooccurrence(self, table="auto"):
        """DynaMo's co-occurrence counts (``--cooccurrence``: a file, an LM build, or auto)."""
        from latticedraft.lm.cooccurrence import resolve_table

        return self._once(("cooccurrence", str(table)), lambda: resolve_table(table, self.tokenizer, notify=self.notify))

    def chat_template(self):
        """The base model's chat template (``--chat``), loaded once; refused where it has none."""
        from latticedraft.decoding.runs.chat import ChatTemplate

        return self._once(("chat",), lambda: ChatTemplate.load(self.base_dir))

    def proposer(self, spec, references=None):
        """The draft source of a ``bpd.DrafterSpec``: a lattice ``Drafter`` of the heads, the draft
        model's ``ModelProposer``, or None (``--drafter none``)."""
        from latticedraft.decoding.proposers.heads import make_drafter

        if spec.name == "none":
            return None
        if spec.name == "model":
            from latticedraft.decoding.proposers.draft_model import ModelProposer

            return ModelProposer(self.draft_model, spec.gamma)
        lm = self.lm if spec.name in ("ngram", "parallel") else None
        rescorer = self.rescorer if spec.name == "neural" else None
        return make_drafter(spec.name, options=spec.lattice_options(), lm=lm, rescorer=rescorer, alpha=spec.alpha,
                            nbest=spec.nbest, references=references)

    def references(self, prompts: list, max_new_tokens: int) -> list[np.ndarray]:
        """The target's greedy continuations of ``prompts`` (what the oracle drafter drafts), computed
        with ``generate`` once per prompt list and budget in this session."""
        from latticedraft.decoding.greedy import greedy_decode

        key = ("references", max_new_tokens, tuple(tuple(int(t) for t in p) for p in prompts))
        return self._once(key, lambda: [q.tokens for q in greedy_decode(self.model, prompts, max_new_tokens=max_new_tokens,
                                                                         eos_token_id=self.eos).sequences])

    def gate(self, spec):
        """The ``HeadGate`` of ``spec`` for this session: what it measured carries over between
        calls (a command decodes its prompts one call at a time)."""
        from latticedraft.decoding.planning.head_gate import HeadGate

        return self._once(("gate", repr(spec)), HeadGate)

    def swap_gate(self, spec, gate):
        """Make ``gate`` the ``HeadGate`` of ``spec`` for the calls that follow; returns the one it
        replaces (a pass that should neither follow nor teach the session's gate brings its own)."""
        old = self.gate(spec)
        self._memo[("gate", repr(spec))] = gate
        return old

    def draft_vocab(self, size: int | str | None):
        """The ``size`` most frequent token ids of the heads' training corpus (int64[size]),
        from ``draft_vocab.json`` beside the head checkpoint; None for None (and for "auto"
        where the checkpoint has no ranking, or a plain causal LM without heads)."""
        from latticedraft.decoding.bpd import AUTO_DRAFT_VOCAB
        from latticedraft.decoding.planning.draft_vocab import FILE, load_ranked

        where = Path(self.model_dir) if self.model_dir is not None else default_model_dir()
        if size == "auto":
            usable = getattr(self.model, "num_heads", 1) > 1 and (where / FILE).is_file()
            size = AUTO_DRAFT_VOCAB if usable else None
        if size is None:
            return None
        return self._once(("draft_vocab", str(where), int(size)), lambda: load_ranked(where, int(size)))

    def lm_drafts(self, spec):
        """What ``spec.lm_drafts`` drafts from: (``LMNgrams``, the LM's ``LMArrays``) or None (off;
        "auto" where no LM built with this tokenizer is there, ``loaders.lm_for``; an LM named with
        ``--lm`` must load and fit)."""
        from latticedraft.decoding.bpd import AUTO_LM_DRAFTS
        from latticedraft.decoding.proposers.lm_ngrams import LMNgrams
        from latticedraft.errors import ModelError
        from latticedraft.lattice.lm_tables import lm_arrays
        from latticedraft.decoding.runs.loaders import lm_for

        depth = spec.lm_drafts
        if not depth:
            return None
        if depth == "auto":
            if self.lm_dir is None:  # the LM that fits this tokenizer where one is built (one named with --lm must)
                if not lm_for(self.tokenizer).is_dir():
                    return None
                try:
                    _ = self.lm
                except ModelError:  # built with another vocabulary: no LM drafts, the rest as asked
                    return None
            depth = AUTO_LM_DRAFTS
        return self._once(("lm_drafts", self.lm_dir, int(depth)), lambda: (LMNgrams(int(depth)), lm_arrays(self.lm.fst)))

    def acceptance(self, spec):
        """Acceptance rates for ``spec``'s drafts, fitted on the held-out calibration prompts
        (``CALIBRATION_PROMPTS`` of data/prompts.jsonl) and cached on disk per model and lattice
        settings; looked up once per session and spec."""
        return self._once(("acceptance", repr(spec)), lambda: self._fit_acceptance(spec))

    def _fit_acceptance(self, spec):
        from dataclasses import replace

        from latticedraft.decoding.planning import acceptance
        from latticedraft.decoding.planning.calibrate import calibrate
        from latticedraft.decoding.runs.loaders import encode
        from latticedraft.decoding.runs.prompt_set import read_prompts

        file = data_dir() / "prompts.jsonl"
        recs = read_prompts(file)[CALIBRATION_PROMPTS] if file.is_file() else []
        lm = self.lm_drafts(spec)
        if not recs or spec.name in ("oracle", "model") or (spec.name == "none" and lm is None):
            return None  # the planner falls back to the uncalibrated prior (no head lattices or LM drafts to fit)
        weights = [p for p in Path(self.base_dir).glob("*.safetensors")]
        if self.model_dir is not None or default_model_dir().exists():
            weights += list(Path(self.model_dir or default_model_dir()).glob("*.safetensors"))
        key = {"weights": sorted((str(w.resolve()), w.stat().st_size, w.stat().st_mtime_ns) for w in weights),
               "spec": {k: getattr(spec, k) for k in ("name", "k", "prune", "eps", "backoff", "slots", "alpha", "nbest",
                                                       "context_ngrams", "draft_vocab")},
               "lm_drafts": None if lm is None else {"depth": lm[0].depth, "lm": str(self.lm.build_dir.resolve()),
                                                "built": self.lm.manifest.get("built_at")},
               "prompts": [r["prompt"] for r in recs]}
        calib = replace(spec, tree="fixed", context_ngrams=0, lookahead=None)

        def build():
            if self.notify:
                self.notify(f"--tree auto: fitting acceptance rates for --drafter {spec.name} on {len(recs)} held-out "
                            "prompts and measuring the step cost T(n) of this model (once per model and settings; "
                            "cached under .cache/acceptance and .cache/cost_model)")
            ids = encode(self.tokenizer, [r["prompt"] for r in recs])
            return calibrate(self.model, self.proposer(calib), ids, context=spec.context(),
                             draft_vocab=self.draft_vocab(spec.draft_vocab), eos_token_id=self.eos, lm=lm)

        return acceptance.cached(key, build)

    # -- decoding -----------------------------------------------------------------------------
    def configure(self, method: str, values: dict | None = None, given=None):
        """The options object of ``method`` from option values (dest -> value; missing: defaults)."""
        values = {"draft_model": self.draft_model_dir, **(values or {})}
        return registry.get(method).configure(values, set(given or ()))

    def prepare(self, method, options=None, batch_size: int = 1) -> None:
        """Check (``check``), then load, measure and check what ``method`` needs now, so that a missing
        file fails before any output and the first decode step pays for nothing (search tables,
        kernels, T(n), rates)."""
        m = registry.get(method) if isinstance(method, str) else method
        options = self.configure(m.name) if options is None else options
        self.check(m, options)
        if m.prepare is not None:
            m.prepare(self, options, batch_size)

    def check(self, method, options) -> None:
        """The method's cheap checks of ``options`` against the model (``Method.check``), which
        ``prepare`` and ``decode`` run before loading, counting, fitting or measuring anything."""
        m = registry.get(method) if isinstance(method, str) else method
        if m.check is not None:
            m.check(self, options)

    def prepare_drafter(self, spec, batch_size: int = 1) -> None:
        """BPD's preparation for a ``DrafterSpec``: the LM's tables and kernels, the draft model, the
        draft vocabulary, and (``--tree auto``) the step-cost curve and acceptance rates."""
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
        lm = self.lm_drafts(spec)  # the LM's tables, its states' best next tokens and the chain kernel
        if lm is not None:
            lm[0].continuation(lm[1], np.zeros(1, dtype=np.int64))
        if spec.tree == "auto" and spec.name != "oracle":  # (the oracle's references come per call)
            # measure T(n) and fit the acceptance rates now (both cached on disk after the first
            # run), so that streaming output and timings never include them; at batch 1 and at
            # the run's batch size, between which a last, partial batch interpolates
            warm = np.asarray(self.tokenizer.encode("import os\n").ids, dtype=np.int64)
            for b in sorted({1, batch_size}):
                self.decode([warm] * b, "bpd", spec, max_new_tokens=2, batch_size=b)

    def decode(self, prompt_ids: list, method: str = "bpd", options=None, *, max_new_tokens: int = 64,
               verify: str = "auto", batch_size: int = 1, sampling=None, on_tokens=None, first_row: int = 0,
               rows: list | None = None, record_steps: bool = False, on_done=None):
        """Decode token-id prompts with ``method`` (its options object, None: its defaults) in batches
        of ``batch_size`` (where the method can, ``Method.continuous``, one continuous batch of that
        many rows: a finished row takes the next prompt); one merged ``DecodeResult`` in prompt
        order. sampling: ``SamplingOptions`` (None: greedy, or the method's own defaults where it
        always samples); rows: each prompt's run-wide id (seeds; default first_row, first_row + 1,
        ...); on_tokens(i, new_ids) streams prompt i's tokens; on_done(i, result) is called with
        prompt i's ``DecodeResult`` alone as it completes (at its last token in a continuous batch,
        else as its batch ends)."""
        from latticedraft.decoding.results import merge
        from latticedraft.decoding.runs.prompt_length import fit_prompts

        m = registry.get(method)
        options = self.configure(m.name) if options is None else options
        self.check(m, options)
        if sampling is not None and m.sampling == "never":
            raise InputError(f"--method {m.name} decodes greedily; the sampling options apply to --method "
                             + ", ".join(n for n, x in registry.methods().items() if x.sampling != "never"))
        if sampling is None and m.sampling == "always":
            sampling = registry.sampling_options(m, {})
        if batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {batch_size}")
        prompt_ids = fit_prompts(self.model, prompt_ids, max_new_tokens)  # every prompt, before the first batch
        rows = list(range(first_row, first_row + len(prompt_ids))) if rows is None else list(rows)
        if m.one_batch(options, batch_size, len(prompt_ids)):  # rows refill as they finish
            req = registry.Request(max_new_tokens=max_new_tokens, eos_token_id=self.eos, sampling=sampling,
                                   verify=verify, rows=rows, on_tokens=on_tokens, record_steps=record_steps,
                                   slots=batch_size, on_done=on_done)
            return m.run(self, prompt_ids, options, req)
        parts = []
        for s in range(0, len(prompt_ids), batch_size):
            cb = None if on_tokens is None else (lambda i, t, s=s: on_tokens(s + i, t))
            req = registry.Request(max_new_tokens=max_new_tokens, eos_token_id=self.eos, sampling=sampling, verify=verify,
                                   rows=rows[s:s + batch_size], on_tokens=cb, record_steps=record_steps)
            r = m.run(self, prompt_ids[s:s + batch_size], options, req)
            for st in r.steps:
                st.row += s
            parts.append(r)
            for j in range(len(r.sequences) if on_done is not None else 0):
                on_done(s + j, r.alone(j))
        return merge(parts)
