"""Decoding algorithms: the BPD loop, drafters, DynaMo sampling, metrics.

- ``bpd``: ``bpd_decode`` (predict -> draft -> verify -> accept, one target call per step,
  batches of prompts of different lengths) and ``greedy_decode`` (the baseline).
- ``drafters``: ``top1``, ``neural``, ``ngram``, ``parallel``, ``parallel-base``, ``oracle``
  behind one interface (``draft(sausage, history)``, ``update(accepted)``).
- ``run``: bundled defaults and a ``Session`` that the CLI, eval, tune, demo and the
  benchmark share; ``evaluate``, ``tune``, ``demo``: the commands' library side.
- ``dynamo``, ``metrics``: DynaMo sampling and multi-token perplexities.
"""
