"""Sausage lattices from multi-token heads: thresholding, rescoring, p-best drafts (numpy only).

- ``sausage``: ``Sausage`` (tokens int64[h,k], logp float32[h,k]), ``SausageBatch`` ([B,h,k]) and ``Drafts``;
- ``threshold``: static / Otsu (OpenCV) thresholds and back-off depth (DynaMo §3.2);
- ``rescoring``: ``rescore``, ``rescore_batch``, ``base_drafts`` (``exact`` or ``wfst``);
- ``search``: the compiled exact p-best search over ``NgramFst`` arrays (``lm_tables``: the LM's arrays and
  tables; ``triple_dp``: orders <= 4; ``state_dp``: higher orders; ``best_first``: heap helpers and the
  head-score-only search); ``batched``: many lattices per call;
- ``oracle``, ``stats``: oracle paths, repetition and entropy statistics (BPD paper §6);
- ``draw``: Figure-4 style pictures.

Attributes are imported lazily, so ``import latticedraft.lattice`` stays cheap.
"""

from importlib import import_module

from latticedraft.lattice._numba_cache import drop_stale

drop_stale()  # kernels inline njit code across modules; numba's cache only sees a kernel's own file

_EXPORTS = {
    "Sausage": "sausage", "SausageBatch": "sausage", "Drafts": "sausage", "load_npz": "sausage",
    "rescore": "rescoring", "rescore_batch": "rescoring", "base_drafts": "rescoring",
    "prune": "threshold", "static_threshold": "threshold", "otsu_threshold": "threshold", "backoff": "threshold",
    "oracle_path": "oracle", "oracle_accepted_by_k": "oracle", "accepted_length": "oracle",
    "repetition": "stats", "slot_entropy": "stats", "h_max": "stats",
    "draw_lattice": "draw",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(f"latticedraft.lattice.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'latticedraft.lattice' has no attribute {name!r}")
