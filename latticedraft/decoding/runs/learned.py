"""What a session learns while it decodes, in one place.

Decoding speed (never the output) depends on state that adapts across a session's decode calls.
``Learned`` holds all of it, keyed by the settings it was learned for (``key``: the drafting
settings' fingerprint, never an object's ``repr``):

- ``gates``: per drafting settings, the ``planning.head_gate.HeadGate`` (tokens per second of the
  heads against context-only steps, per context-match bucket);
- ``corrections``: per drafting settings and sampling settings, the auto tree's
  ``planning.acceptance.RateCorrection`` (what verification kept of each source's rated nodes);
- ``sources``: per draft source and value, its proposer, which keeps what it learns: the suffix
  drafts' memory of earlier outputs, the self-draft's calibration and measured step time, the
  draft model's calibration;
- ``fitted``: per drafting settings, the ``AcceptanceModel`` the auto tree rates paths with: the
  counts read from ``.cache/acceptance`` and those of this session's greedy steps, stored back
  there after every decode call (the next session starts from them);
- ``weights``: per model, n-gram LM and lattice settings, the n-gram drafters' learned
  interpolation weight (``planning.rescore_weight.AlphaLearner``: what the target kept of the
  rescored and the heads' own rankings), read from ``.cache/rescore_weight`` and stored back there
  after every decode call;
- ``events``: one line per thing fitted, measured or loaded from the cache (``decode --verbose``
  prints them).

Measured per model rather than per session, and kept on the model (``memo.kept``): the
verifier's output-projection timings and walk statistics and the lean layer stacks; the step cost
T(n) is persisted in ``.cache/cost_model``. ``reset`` forgets the session's part. What is kept on
disk is advisory (``latticedraft/learned_state.py``): an entry that fails its schema reads as absent
(one event names the file) and one that cannot be written is said once on stderr, never an error.

    >>> learned = Learned()
    >>> gate = learned.gate(spec)            # doctest: +SKIP  (the same object on every call for spec)
"""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass


def key(settings) -> str:
    """A stable key of settings (a dataclass or plain values): their JSON, sorted."""
    if is_dataclass(settings):
        settings = {"type": type(settings).__name__, **asdict(settings)}
    return json.dumps(settings, sort_keys=True, default=repr)


class Learned:
    """The adaptive state of one session (see the module doc); ``notify(line)``, where set, hears
    each event as it happens."""

    def __init__(self, notify=None):
        self.notify = notify
        self.reset()

    def reset(self) -> None:
        """Forget everything learned in this session (the on-disk caches stay)."""
        self.gates: dict = {}
        self.corrections: dict = {}
        self.sources: dict = {}
        self.fitted: dict = {}
        self.weights: dict = {}
        self.events: list[str] = []

    def event(self, line: str) -> None:
        """Record (and report, where ``notify`` is set) one thing fitted, measured or loaded."""
        self.events.append(line)
        if self.notify is not None:
            self.notify(line)

    def gate(self, spec):
        """The ``HeadGate`` of drafting settings ``spec``, made on first use."""
        from latticedraft.decoding.planning.head_gate import HeadGate

        return self.gates.setdefault(key(spec), HeadGate())

    def swap_gate(self, spec, new):
        """Make ``new`` the gate of ``spec`` from now on; returns the one it replaces (a pass that
        should neither follow nor teach the session's gate brings its own)."""
        old = self.gate(spec)
        self.gates[key(spec)] = new
        return old

    def correction(self, spec, sampling):
        """The auto tree's ``RateCorrection`` for ``spec`` at these sampling settings (None: greedy)."""
        from latticedraft.decoding.planning.acceptance import RateCorrection

        return self.corrections.setdefault((key(spec), key(sampling) if sampling is not None else None),
                                           RateCorrection())

    def source(self, name: str, value, build):
        """The proposer of draft source ``name`` at option value ``value``, ``build()`` on first use."""
        k = (name, key(value) if not isinstance(value, (int, str, float, tuple)) else value)
        if k not in self.sources:
            self.sources[k] = build()
        return self.sources[k]

    def acceptance(self, spec, read):
        """The acceptance counts of ``spec``: ``read()`` (the stored ones, or none) on first use."""
        k = key(spec)
        if k not in self.fitted:
            self.fitted[k] = read()
        return self.fitted[k]

    def rescore_weight(self, settings: dict, read):
        """The n-gram weight's ``AlphaLearner`` for ``settings``: ``read()`` on first use."""
        k = key(settings)
        if k not in self.weights:
            self.weights[k] = read()
        return self.weights[k]

    @staticmethod
    def key_of(spec) -> str:
        """The key settings are kept under (``key``)."""
        return key(spec)
