"""A ``Session``: the model and tokenizer of one command, the files its methods load on first use
(the n-gram LM, the neural rescorer, the draft model, adapters, co-occurrence counts, the chat
template), each once (``once``), what it learns as it decodes (``learned``: ``runs/learned.py``,
the one place for gates, rate corrections, sources' calibration and fitted rates), and ``decode``:
any registered method (``decoding/registry.py``) over token-id prompts, in batches. It knows no
decoder.

    >>> s = Session()                                     # doctest: +SKIP
    >>> spec = s.configure("bpd", {"drafter": "parallel", "nbest": 8})
    >>> s.prepare("bpd", spec)                            # loads, measures and checks before output
    >>> r = s.decode(encode(s.tokenizer, ["import os\\n"]), "bpd", spec, max_new_tokens=32)
"""

from __future__ import annotations



from latticedraft.decoding import registry
from latticedraft.decoding.runs.learned import Learned
from latticedraft.decoding.runs.loaders import (base_dir_of, end_ids, load_adapter_for,
                                                load_draft_model, load_exit_heads_for, load_lm, load_model,
                                                load_rescorer, load_tokenizer_for)
from latticedraft.errors import InputError



def weights_dtype(model) -> str:
    """The dtype of ``model``'s weights as ``--dtype`` spells it ("float32", "bfloat16", "float16")."""
    p = next(iter(model.parameters()), None)
    return "float32" if p is None else str(p.dtype).replace("torch.", "")


class Session:
    """model_dir: heads checkpoint or HF causal LM (default ``data/heads-stern``); tokenizer_path,
    lm_dir, rescorer_dir, draft_model_dir: as the CLI's options (None: defaults); threads: torch
    CPU threads (None: torch's choice); model: an already loaded model to decode with (a
    ``BlockwiseModel`` or an HF causal LM: ``custom_generate``'s) instead of loading ``model_dir``,
    which then names where its heads came from (``draft_vocab.json``, the tokenizer beside them);
    dtype: the weights' dtype when ``model_dir`` is loaded here ("float32" default, "bfloat16",
    "float16"; the heads and the draft model follow the base)."""

    def __init__(self, model_dir=None, tokenizer_path=None, lm_dir=None, rescorer_dir=None, device=None,
                 threads: int | None = None, draft_model_dir=None, model=None, dtype=None):
        if threads is not None:
            if threads < 1:
                raise InputError(f"--threads must be >= 1, got {threads}")
            import torch

            torch.set_num_threads(threads)  # tiny models: per-op thread sync costs more than it saves
        self.model_dir = model_dir
        self.model = load_model(model_dir, device=device, dtype=dtype) if model is None else model
        self.tokenizer = load_tokenizer_for(self.model, model_dir, tokenizer_path)
        self.base_dir = base_dir_of(self.model, model_dir)
        self.lm_dir, self.rescorer_dir, self.device = lm_dir, rescorer_dir, device
        self.draft_model_dir = draft_model_dir
        self._memo: dict = {}  # (what, key) -> what the session loaded once
        self.learned = Learned()  # what adapts as it decodes: gates, corrections, sources, fitted rates
        self.notify = None  # notify(message): one-time work worth telling a user about (the CLI: stderr)
        self.eos = end_ids(self.model, self.tokenizer)  # as generate: the generation config's end id(s)
        self.dtype = weights_dtype(self.model)  # "float32", "bfloat16" ...: what records and summaries name

    def files(self) -> dict:
        """The file options this session loads from (dest -> the path given, None: the default)."""
        return {"lm": self.lm_dir, "rescorer": self.rescorer_dir, "draft_model": self.draft_model_dir}

    def once(self, key, build):
        """``build()`` the first time ``key`` is asked for in this session, the same object after."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    # -- what methods load --------------------------------------------------------------------
    @property
    def lm(self):
        return self.once(("lm", self.lm_dir), lambda: load_lm(self.lm_dir, self.tokenizer))

    @property
    def rescorer(self):
        return self.once(("rescorer", self.rescorer_dir),
                          lambda: load_rescorer(self.rescorer_dir, self.device, self.tokenizer))

    @property
    def draft_model(self):
        """The auxiliary draft model (``--draft-model DIR``), checked against the target."""
        return self.once(("draft_model", self.draft_model_dir),
                          lambda: load_draft_model(self.draft_model_dir, self.model, self.device, self.tokenizer))

    def adapter(self, path=None):
        """Kangaroo's adapter (default ``data/adapter-kangaroo``), checked against the base."""
        return self.once(("adapter", str(path)), lambda: load_adapter_for(self.model, path))

    def exit_heads(self, path=None):
        """PPD's early-exit heads from ``path`` (None: the shared LM head)."""
        return self.once(("exit_heads", str(path)), lambda: load_exit_heads_for(self.model, path))

    def cooccurrence(self, table="auto"):
        """DynaMo's co-occurrence counts (``--cooccurrence``: a file, an LM build, or auto)."""
        from latticedraft.lm.cooccurrence import resolve_table

        return self.once(("cooccurrence", str(table)), lambda: resolve_table(table, self.tokenizer, notify=self.notify))

    def chat_template(self):
        """The base model's chat template (``--chat``), loaded once; refused where it has none."""
        from latticedraft.decoding.runs.chat import ChatTemplate

        return self.once(("chat",), lambda: ChatTemplate.load(self.base_dir))

    # -- decoding -----------------------------------------------------------------------------
    def configure(self, method: str, values: dict | None = None, given=None):
        """The options object of ``method`` from option values (dest -> value; missing: defaults).
        Every value passed counts as given, as a typed option does on the command line: one that
        ``method`` does not read is refused as the CLI refuses it (``registry.refuse_unread``)."""
        given = set(given or ()) | set(values or {})
        values = {"draft_model": self.draft_model_dir, "model": self.model_dir, **(values or {})}
        return registry.get(method).configure(values, given)

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
        ``prepare`` and ``decode`` run before loading, counting, fitting or measuring anything; first
        the files the options cannot decode without (``Method.check_files``, as the CLI checks them
        before the model loads; once per method and options: the default LM's path reads its manifest and
        hashes the vocabulary)."""
        m = registry.get(method) if isinstance(method, str) else method
        if m.check_files is not None:
            self.once(("check_files", m.name, repr(options)),
                      lambda: m.check_files(options, self.files(), self.tokenizer))
        if m.check is not None:
            m.check(self, options)

    def decode(self, prompt_ids: list, method: str = "bpd", options=None, *, max_new_tokens: int = 64,
               verify: str = "auto", batch_size: int = 1, sampling=None, on_tokens=None, first_row: int = 0,
               rows: list | None = None, record_steps: bool = False, on_done=None):
        """Decode token-id prompts with ``method`` (its options object, None: its defaults, as
        ``configure`` gives them with ``do_sample`` where ``sampling`` is set) in batches
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
        if sampling is not None and m.sampling == "never":
            raise InputError(f"--method {m.name} decodes greedily; the sampling options apply to --method "
                             + ", ".join(n for n, x in registry.methods().items() if x.sampling != "never"))
        options = self.configure(m.name, {"do_sample": sampling is not None}) if options is None else options
        self.check(m, options)
        if sampling is None and m.sampling == "always":
            from latticedraft.decoding.accept.sampling import sampling_options

            sampling = sampling_options(m, {})
        if batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {batch_size}")
        prompt_ids = fit_prompts(self.model, prompt_ids, max_new_tokens)  # every prompt, before the first batch
        rows = list(range(first_row, first_row + len(prompt_ids))) if rows is None else list(rows)
        if m.one_batch(options, batch_size, len(prompt_ids)):  # rows refill as they finish
            req = registry.Request(max_new_tokens=max_new_tokens, eos_token_id=self.eos, sampling=sampling,
                                   verify=verify, rows=rows, on_tokens=on_tokens, record_steps=record_steps,
                                   in_flight=batch_size, on_done=on_done)
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
