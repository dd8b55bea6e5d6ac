"""Language models for rescoring: n-gram building (KenLM → ARPA → WFST), scoring, statistics.

``NgramLM``, ``LMState`` (``latticedraft.lm.ngram``) and ``NgramFst`` (``latticedraft.lm.wfst``)
are importable from here; they load on first use so ``import latticedraft.lm`` stays cheap.
"""

_LAZY = {"NgramLM": "latticedraft.lm.ngram", "LMState": "latticedraft.lm.ngram", "NgramFst": "latticedraft.lm.wfst"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'latticedraft.lm' has no attribute {name!r}")
