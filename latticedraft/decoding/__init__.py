"""Decoding: the one decode loop, the methods on it, and what runs them.

- ``loop``: ``speculative_decode`` (draft -> plan -> verify -> accept, batches of prompts of
  different lengths, continuous batching); ``rows``, ``results``: per-row bookkeeping and what
  every decoder returns.
- ``registry``: every method as one entry (options, checks, label, settings, how it runs), and
  ``option`` / ``add_options``: an options field that declares its flag once.
- ``methods``: one module per method (``bpd`` with ``bpd_loop`` and ``bpd_session``, ``greedy``,
  ``lookahead``, ``kangaroo``, ``mtad``, ``ppd``, ``dynamo``); none imports torch at import time.
- ``proposers``: what drafts (heads' lattices, context and LM n-grams, suffix drafts, a draft
  model, lookahead's pool, Kangaroo's adapter, MTAD); ``planning``: which drafts a step verifies
  (the cost-aware tree, acceptance rates, the head gate, the draft vocabulary); ``accept``:
  acceptance rules (greedy, lossless sampling, MTAD's); ``ppd``, ``dynamo``: the decoders
  whose outer loop is their own (PPD; DynaMo sampling and multi-token perplexities).
- ``runs``: ``Session`` (loaders, chat templates, data-set runs, sharding) that the CLI, eval and the
  benchmarks share; ``eval``: evaluate, tune, demo and HF's baselines; ``custom_generate``: the
  transformers ``custom_generate`` entry.
"""
