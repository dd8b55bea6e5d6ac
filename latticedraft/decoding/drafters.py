"""Every ``--drafter``, registered once: its name, what it drafts from and the file it reads.

The drafter is a ``--method bpd`` decode's first proposer (the draft sources of ``sources.py``
ride beside it). Which drafters read the heads' lattice (and so which lattice options apply,
``registry.option(..., only=HEADS)``), which read the n-gram LM, the neural rescorer or the
auxiliary draft model (its file option: part of the settings fingerprint and refused for the
others), and the ``--drafter`` help all come from this table; ``proposers.heads.make_drafter``
builds each one. Torch-free: ``--help`` imports it.

    >>> HEADS
    ('top1', 'neural', 'ngram', 'parallel', 'parallel-base', 'oracle')
    >>> reading("lm")
    ('ngram', 'parallel')
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Drafter:
    """name: the ``--drafter`` value; summary: one line for the help; heads: it drafts from the
    heads' lattice; file: the file option it reads (``lm``, ``rescorer``, ``draft_model``) or None."""

    name: str
    summary: str
    heads: bool = False
    file: str | None = None


DRAFTERS = (
    Drafter("top1", "vanilla BPD: each head's most likely token", heads=True),
    Drafter("neural", "Algorithm 2: every slot rescored by a small neural LM (--rescorer)", heads=True,
            file="rescorer"),
    Drafter("ngram", "the best path of the lattice rescored by the n-gram LM (--lm)", heads=True, file="lm"),
    Drafter("parallel", "the --nbest best paths of the n-gram-rescored lattice", heads=True, file="lm"),
    Drafter("parallel-base", "the --nbest best paths of the lattice as the heads score it", heads=True),
    Drafter("oracle", "the lattice's best path given the greedy output (an evaluation upper bound)", heads=True),
    Drafter("model", "an auxiliary draft model (--draft-model DIR): classic speculative decoding", file="draft_model"),
    Drafter("none", "no drafter: the draft sources alone (prompt lookup, LM n-grams, the self-draft...)"),
)
NAMES = tuple(d.name for d in DRAFTERS)
HEADS = tuple(d.name for d in DRAFTERS if d.heads)


def reading(file: str) -> tuple:
    """The drafters that read file option ``file``."""
    return tuple(d.name for d in DRAFTERS if d.file == file)


def file_of(name: str) -> str | None:
    """The file option drafter ``name`` reads (None: none, or no such drafter)."""
    return next((d.file for d in DRAFTERS if d.name == name), None)


def help_text() -> str:
    """The ``--drafter`` help: every drafter and what it drafts."""
    return "; ".join(f"{d.name} = {d.summary}" for d in DRAFTERS)
