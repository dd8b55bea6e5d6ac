"""Decoding: the one decode loop, the methods on it, and what runs them.

- ``loop``: ``speculative_decode`` (draft -> plan -> verify -> accept, batches of prompts of
  different lengths, continuous batching); ``rows``, ``results``: per-row bookkeeping and what
  every decoder returns.
- ``registry``: every method as one entry (options, checks, label, settings, how it runs);
  ``bpd`` (the heads' drafts), ``greedy`` (the reference); the other methods live beside their
  proposers (``proposers/lookahead``, ``kangaroo``, ``mtad``), in ``self_draft`` (PPD) and ``dynamo``.
- ``proposers``: what drafts (heads' lattices, context and LM n-grams, a draft model, lookahead's
  pool, Kangaroo's adapter, MTAD); ``planning``: which drafts a step verifies (the cost-aware tree,
  acceptance rates, the head gate, the draft vocabulary); ``accept``: acceptance rules (greedy,
  lossless sampling, MTAD's).
- ``runs``: ``Session`` (loaders, chat templates, data-set runs, sharding) that the CLI, eval and the
  benchmarks share; ``eval``: evaluate, tune, demo and HF's baselines; ``custom_generate``: the
  transformers ``custom_generate`` entry; ``dynamo``: DynaMo sampling and multi-token perplexities.
"""
