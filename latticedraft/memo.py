"""What is derived from an object is kept on that object: no module-level caches.

``memo_of(obj, name)`` is a dict stored in ``obj.__dict__`` (beside an ``nn.Module``'s attributes,
not registered as one), made on first use. It lives and dies with ``obj``; a deep copy or a
pickle of ``obj`` starts without it (what it holds is made again for the copy's own weights).
The model keeps its verifiers (``Verifier.for_model``), its lean layer stack and its sessions for
``generate`` (``custom_generate``); an output projection module its screened projections. What is
derived from weights is made again when they change (``kept`` with ``weights_key``).

    >>> memo_of(model, "sessions").setdefault(key, make())      # doctest: +SKIP
    >>> kept(model, "verify", "stack", weights_key(model), lambda: LeanStack(model))  # doctest: +SKIP
"""

from __future__ import annotations


class Memo(dict):
    """A dict that deep-copies and pickles as an empty one."""

    def __deepcopy__(self, memo):
        return type(self)()

    def __reduce__(self):
        return (type(self), ())


def memo_of(obj, name: str) -> Memo:
    """``obj``'s memo called ``name`` (attribute ``_latticedraft_<name>``), made on first use."""
    return obj.__dict__.setdefault(f"_latticedraft_{name}", Memo())


def kept(obj, name: str, slot, version, make):
    """The value ``make()`` kept in ``obj``'s memo ``name`` under ``slot``, made again when
    ``version`` differs from the one it was made at (e.g. ``weights_key``)."""
    memo = memo_of(obj, name)
    hit = memo.get(slot)
    if hit is None or hit[0] != version:
        hit = memo[slot] = (version, make())
    return hit[1]


def weights_key(module) -> tuple:
    """Changes when any parameter of ``module`` is replaced (``.to()``, loading) or updated in
    place (training)."""
    return tuple((p.data_ptr(), p._version) for p in module.parameters())
