"""Acceptance rules: how the verifier's logits and one step's proposals become emitted tokens.

Acceptance runs outside the verifier, between its forward and its commit
(``gpu/verify/tree_call.py``): the decode loop's accept phase walks the call's draft trees with
the rule's ``choose``, choosing the token at each visited node, which gives each row's accepted
node path and bonus token. A rule has ``for_step(rows, drafts, qs, histories) -> choose`` (None: the
target's argmax, greedy acceptance) and ``lossless`` (whether the output keeps the target's
greedy output or sampling distribution). ``choose(batch_rows, logits [m, V], prefixes, logits_at)
-> (tokens int64[m], stop bool[m] or None)`` picks the token at each walked node (prefixes: the
draft tokens from the root to it; ``logits_at(rows, prefixes)`` the logits at other nodes; stop:
end the walk at that token even if it is a child); the first token after a prompt comes from
``for_step(rows, None, None, prompts)`` with every prefix empty.

- ``GreedyRule``: exact greedy decoding.
- ``accept.sampling.SpeculativeRule``: lossless multi-step speculative sampling.
- ``accept.mtad.MtadRule``: MTAD's joint acceptance (approximate).
"""

from __future__ import annotations


class GreedyRule:
    """The target's argmax everywhere."""

    lossless = True
    draws = None

    def for_step(self, rows, drafts=None, qs=None, histories=None):
        return None


def reads(choose) -> str | int:
    """What ``choose`` reads at each walked node, for the verifier's output projection: "argmax"
    (greedy: None), a top-k's k (its ``top_k`` attribute) or "logits"."""
    if choose is None:
        return "argmax"
    return getattr(choose, "top_k", None) or "logits"

