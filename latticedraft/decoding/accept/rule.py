"""Acceptance rules: how the verifier's logits and one step's proposals become emitted tokens.

A rule has ``for_step(rows, drafts, qs, histories) -> choose`` (None: the verifier's own greedy
walk, the longest draft prefix equal to the target's argmax plus its argmax after it) and
``lossless`` (whether the output keeps the target's greedy output or sampling distribution).
``choose(batch_rows, logits [m, V], prefixes, logits_at)`` picks the token at each walked node
(``gpu/verify/verifier.py`` documents the walk); the prefill's first token comes from
``for_step(rows, None, None, prompts)`` with every prefix empty.

- ``GreedyRule``: exact greedy decoding.
- ``accept.sampling.SpeculativeRule``: lossless multi-step speculative sampling.
- ``accept.mtad.MtadRule``: MTAD's joint acceptance (approximate).
"""

from __future__ import annotations


class GreedyRule:
    """The target's argmax everywhere (the verifier's walk needs no hook)."""

    lossless = True
    draws = None

    def for_step(self, rows, drafts=None, qs=None, histories=None):
        return None
