"""What is derived from an object is kept on that object: no module-level caches.

``memo_of(obj, name)`` is a dict stored in ``obj.__dict__`` (beside an ``nn.Module``'s attributes,
not registered as one), made on first use. It lives and dies with ``obj``; a deep copy or a
pickle of ``obj`` starts without it (what it holds is made again for the copy's own weights).
The model keeps its verifiers (``Verifier.for_model``) and its sessions for ``generate``
(``custom_generate``); an output projection module its screened projections.

    >>> memo_of(model, "verifiers").setdefault(key, make())      # doctest: +SKIP
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
