"""``KVCache``: the verifier's keys and values, preallocated and written in place.

Every layer's keys and values live in one tensor ``store [layers, 2, b, kv_heads, C, head_dim]``
(C slots, grown by doubling when a forward needs more). A forward first ``reserve`` s its n nodes
after the ``length`` slots in use; each layer then writes its keys and values there
(``write``, or ``update`` for transformers' attention modules, which call it) and reads the
slots ``[0, length + n)`` as one view -- no concatenation, no copy of the cache per step.

Bookkeeping, per row and slot, lives on the host as numpy arrays (a step's masks are built
there and cross to the device once): ``valid`` (the slot holds a real token) and ``pos`` (its
position id, -1 where invalid), views of preallocated buffers; ``next_pos`` is each row's next
position. Several forwards may reserve slots before one commit (Kangaroo drafts token by token,
PPD runs a token's layer ranges apart): the reserved slots ``[length, end)`` are *pending*,
``mark`` records who each holds and ``keys`` shows them with the committed ones to the next
forward. ``commit`` keeps the accepted nodes:

- the accepted path is the written prefix (one token, a chain, the first draft): nothing moves;
- otherwise only the accepted nodes are gathered into place, in one gather and one copy for
  every layer at once.

Rolling buffer (``window`` = W, Mistral 7B section 2): position p of a row lives in slot
``p mod W``; a forward's nodes are written after the slots in use (at most W) and ``roll_in``
moves the kept ones to their slots in one scatter for every layer -- nothing when they are
already there (a row whose positions have not wrapped yet and that accepted its written prefix).
Slot order is then not position order; masks are built from ``pos`` (tree mode).

Models that build their own masks (the batched fallback; the incremental LM over a model the lean
stack does not run) take ``transformers_cache()``: the same store shown as transformers'
``DynamicCache``, whose layers write the reserved nodes in place. There slot distances must equal
position distances, which ``left_align`` restores after rows accepted different numbers of nodes.

    >>> c = KVCache(batch=1, layers=2, device="cpu")
    >>> start = c.reserve(3)           # then every layer: K, V = c.write(layer, k, v)
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from latticedraft.errors import InputError


class KVCache:
    """batch rows; layers: decoder layers held (``first_layer`` .. ``first_layer + layers - 1``:
    the split verifier's range, one of PPD's or Kangaroo's); window: W for a rolling buffer (None:
    every position kept). The one KV cache of every verification mode and of the incremental LM."""

    def __init__(self, batch: int, layers: int, device="cpu", window: int | None = None, first_layer: int = 0,
                 capacity: int = 64):
        self.batch, self.layers, self.first_layer, self.window = int(batch), int(layers), int(first_layer), window
        self.device = torch.device(device)
        self.store: torch.Tensor | None = None  # allocated at the first write (heads, head size, dtype)
        self.capacity = max(int(capacity), 1)
        self._valid = np.zeros((self.batch, self.capacity), dtype=bool)
        self._pos = np.full((self.batch, self.capacity), -1, dtype=np.int64)
        self.next_pos = np.zeros(self.batch, dtype=np.int64)
        self.length = 0  # slots in use
        self.end = 0  # slots in use + the current forward's reserved nodes

    # -- views ------------------------------------------------------------------------------
    @property
    def valid(self) -> np.ndarray:
        """bool[b, length]: the slot holds a real token."""
        return self._valid[:, : self.length]

    @property
    def pos(self) -> np.ndarray:
        """int64[b, length]: the slot's position id (-1 where invalid)."""
        return self._pos[:, : self.length]

    @property
    def rolling(self) -> bool:
        return self.window is not None

    @property
    def cache(self) -> "KVCache":
        """What a transformers forward under latticedraft's own 4-D masks takes as its cache (this
        object: ``update``, ``get_seq_length``)."""
        return self

    def transformers_cache(self) -> DynamicCache:
        """This cache as transformers' ``DynamicCache``, for a forward whose model builds its own masks
        from it: each layer shows slots [0, length) and writes the reserved nodes in place (``write``).
        Build one per forward, after ``reserve``; the store is not copied."""
        if self.first_layer or self.rolling:
            raise InputError("transformers_cache: only a cache of every layer without a rolling buffer")
        cache = DynamicCache()
        cache.layers = [_InPlaceLayer(self, i) for i in range(self.layers)]
        return cache

    def nbytes(self) -> int:
        """Bytes of keys and values in use (the current forward's nodes included)."""
        if self.store is None:
            return 0
        L, _, b, h, _, d = self.store.shape
        return L * 2 * b * h * self.end * d * self.store.element_size()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def save(self) -> tuple:
        """What ``restore`` needs to undo every later commit (the cost model's repeated steps)."""
        return self.length, self.next_pos.copy(), self._valid.copy(), self._pos.copy()

    def restore(self, saved: tuple) -> None:
        self.length, next_pos, valid, pos = saved
        self.end, self.next_pos = self.length, next_pos.copy()
        self._valid[:, : valid.shape[1]], self._pos[:, : pos.shape[1]] = valid, pos

    # -- writing ------------------------------------------------------------------------------
    def reserve(self, n: int) -> int:
        """Room for a forward of n nodes after the slots in use and those already reserved (pending
        a commit); returns their first slot."""
        start = self.end
        self._grow(start + n)
        self.end = start + n
        return start

    def mark(self, valid, pos) -> None:
        """Record the last reserved n slots (pending a commit): valid bool[b, n] (False: a row with no
        token there, masked), pos int64[b, n] (numpy or torch)."""
        valid, pos = _host(valid), _host(pos)
        n = valid.shape[1]
        self._valid[:, self.end - n:self.end] = valid
        self._pos[:, self.end - n:self.end] = np.where(valid, pos, -1)

    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        """(valid bool[b, end], pos int64[b, end]) of every slot a new forward's queries may see: the
        committed ones, then those pending (``mark``). Take them before that forward's ``reserve``."""
        return self._valid[:, : self.end], self._pos[:, : self.end]

    def commit_prefix(self, start: int, counts) -> None:
        """Keep the first ``counts[i]`` slots reserved after ``start`` in row i (int64[b]), drop the rest."""
        counts = _host(counts)
        m = max(int(counts.max()), 1)
        keep = np.broadcast_to(np.arange(m), (self.batch, m))
        self.commit(start, keep, keep < counts[:, None], prefix=True)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer`` (0-based within this cache) of the reserved nodes: k, v [b, kv_heads, n,
        head_dim]; returns the keys and values of slots [0, end) as views."""
        if self.store is None:
            self._allocate(k)
        K, V = self._k[layer], self._v[layer]
        end = self.end
        K[:, :, end - k.shape[2]:end] = k
        V[:, :, end - k.shape[2]:end] = v
        return K[:, :, :end], V[:, :, :end]

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """transformers' ``Cache.update``: the attention modules of a model call it per layer."""
        return self.write(layer_idx - self.first_layer, key_states, value_states)

    def _allocate(self, k: torch.Tensor) -> None:
        b, h, _, d = k.shape
        if b != self.batch:
            raise InputError(f"a forward of {b} rows on a cache of {self.batch}")
        self._set_store(torch.zeros(self.layers, 2, b, h, self.capacity, d, dtype=k.dtype, device=k.device))

    def _set_store(self, store: torch.Tensor) -> None:
        """The store and its per-layer key and value views."""
        self.store = store
        self._k = [store[i, 0] for i in range(store.shape[0])]
        self._v = [store[i, 1] for i in range(store.shape[0])]

    def _grow(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity)
        valid = np.zeros((self.batch, cap), dtype=bool)
        pos = np.full((self.batch, cap), -1, dtype=np.int64)
        valid[:, : self.capacity], pos[:, : self.capacity] = self._valid, self._pos
        self._valid, self._pos = valid, pos
        if self.store is not None:
            L, two, b, h, _, d = self.store.shape
            store = torch.zeros(L, two, b, h, cap, d, dtype=self.store.dtype, device=self.store.device)
            store[..., : self.end, :] = self.store[..., : self.end, :]
            self._set_store(store)
        self.capacity = cap

    # -- keeping what was accepted --------------------------------------------------------------
    def append_valid(self, valid, pos) -> None:
        """Keep every reserved slot (a prefill): valid bool[b, n], pos int64[b, n] (numpy or torch)."""
        valid, pos = _host(valid), _host(pos)
        start, n = self.length, valid.shape[1]
        self._valid[:, start:start + n] = valid
        self._pos[:, start:start + n] = np.where(valid, pos, -1)
        self.length = self.end = start + n
        last = np.where(valid, pos, -1).max(axis=1) + 1
        self.next_pos = np.where(valid.any(axis=1), last, self.next_pos)

    def commit(self, start: int, keep, keep_valid, prefix: bool | None = None) -> None:
        """Keep, of the reserved slots after ``start``, those in ``keep`` int64[b, m] (indices into
        the reserved slots, in order; ``keep_valid`` bool[b, m] False for padding entries, whose
        slots stay invalid). Positions continue ``next_pos``. prefix: ``keep`` is ``0..m-1`` wherever
        ``keep_valid`` (computed when None): then nothing moves."""
        keep, keep_valid = _host(keep), _host(keep_valid)
        m = keep.shape[1]
        new_pos = np.where(keep_valid, self.next_pos[:, None] + np.cumsum(keep_valid, axis=1) - 1, -1)
        if self.rolling:
            n_app = self.end - start  # the padding entries point past the reserved slots: dropped
            app = np.full((self.batch, n_app + 1), -1, dtype=np.int64)
            np.put_along_axis(app, np.where(keep_valid, keep, n_app), new_pos, axis=1)
            self.roll_in(start, app[:, :n_app])
            return
        if prefix is None:
            prefix = bool((keep == np.arange(m))[keep_valid].all())
        if not prefix and self.store is not None:
            L, two, b, h, _, d = self.store.shape
            src = self.store[..., start:self.end, :]
            idx = torch.from_numpy(np.clip(keep, 0, self.end - start - 1)).to(self.store.device)
            self.store[..., start:start + m, :] = torch.gather(src, 4, idx[None, None, :, None, :, None].expand(
                L, two, b, h, m, d))
        self._valid[:, start:start + m] = keep_valid
        self._pos[:, start:start + m] = new_pos
        self.length = self.end = start + m
        self.next_pos = self.next_pos + keep_valid.sum(axis=1)

    def roll_in(self, start: int, app_pos) -> None:
        """Rolling buffer: write the reserved slots after ``start`` whose position is given
        (``app_pos`` int64[b, m], -1 = drop) to slots ``pos mod W``; the buffer then holds
        ``max(start, min(W, max next_pos))`` slots. Positions of a row must continue its ``next_pos``."""
        app_pos = _host(app_pos)
        W, m = int(self.window), app_pos.shape[1]
        kept = app_pos >= 0
        nxt = np.maximum(self.next_pos, app_pos.max(axis=1) + 1)
        size = max(min(W, int(nxt.max())), start)
        trash = self.capacity - 1  # never a ring slot (capacity >= W + the largest forward)
        dst = np.where(kept, app_pos % W, trash)
        in_place = bool(((dst == start + np.arange(m)) | ~kept).all())
        if self.store is not None and not in_place:
            L, two, b, h, _, d = self.store.shape
            moved = self.store[..., start:start + m, :].clone()
            idx = torch.from_numpy(dst).to(self.store.device)
            self.store.scatter_(4, idx[None, None, :, None, :, None].expand(L, two, b, h, m, d), moved)
        if size > start:
            self._valid[:, start:size] = False
            self._pos[:, start:size] = -1
        rows = np.arange(self.batch)[:, None]
        self._valid[rows, dst] = kept
        self._pos[rows, dst] = app_pos
        self.length = self.end = size
        self.next_pos = nxt

    def append_rows(self, other: "KVCache") -> None:
        """Add ``other``'s rows after this cache's (prompts admitted into a running batch, each
        prefilled on its own): same layers and window. Both keep their slots; the slots past a
        row's own length are invalid (masks come from ``valid`` and ``pos``, so a row's slot
        numbers never mean positions)."""
        if (other.layers, other.first_layer, other.window) != (self.layers, self.first_layer, self.window):
            raise InputError("append_rows: the caches hold different layers or windows")
        b1, b2 = self.batch, other.batch
        length = max(self.length, other.length)
        cap = max(self.capacity, other.capacity)
        valid = np.zeros((b1 + b2, cap), dtype=bool)
        pos = np.full((b1 + b2, cap), -1, dtype=np.int64)
        valid[:b1, : self.length], pos[:b1, : self.length] = self.valid, self.pos
        valid[b1:, : other.length], pos[b1:, : other.length] = other.valid, other.pos
        ref = self.store if self.store is not None else other.store
        if ref is not None:
            L, two, _, h, _, d = ref.shape
            store = torch.zeros(L, two, b1 + b2, h, cap, d, dtype=ref.dtype, device=ref.device)
            if self.store is not None:
                store[:, :, :b1, :, : self.length] = self.store[..., : self.length, :]
            if other.store is not None:
                store[:, :, b1:, :, : other.length] = other.store[..., : other.length, :].to(ref.device)
            self._set_store(store)
        self._valid, self._pos, self.capacity = valid, pos, cap
        self.next_pos = np.concatenate([self.next_pos, other.next_pos])
        self.length = self.end = length
        self.batch = b1 + b2

    def left_align(self) -> None:
        """Move each row's valid slots to the right end of [0, length) (invalid ones first, order
        kept), so that slot distances equal position distances: models that build causal and
        sliding-window masks from slot indices need it (``transformers_cache``)."""
        order = np.argsort(self.valid, axis=1, kind="stable")  # False sorts first
        if (order == np.arange(self.length)).all():
            return
        if self.store is not None:
            L, two, b, h, _, d = self.store.shape
            idx = torch.from_numpy(order).to(self.store.device)[None, None, :, None, :, None]
            held = self.store[..., : self.length, :]
            held.copy_(torch.gather(held, 4, idx.expand(L, two, b, h, self.length, d)))
        rows = np.arange(self.batch)[:, None]
        self._valid[:, : self.length] = self.valid[rows, order]
        self._pos[:, : self.length] = self.pos[rows, order]

    def truncate(self, length: int) -> None:
        """Drop the slots from ``length`` on (a forward whose nodes are all discarded)."""
        self.length = self.end = int(length)

    def fork(self, rows) -> "KVCache":
        """A new cache holding copies of rows ``rows`` (int64[b'], repeats allowed); this one unchanged."""
        import copy

        other = copy.copy(self)
        other.select_rows(rows)
        return other

    def select_rows(self, rows) -> None:
        """Keep only batch rows ``rows`` (int64[b'], in the new order), e.g. to drop finished sequences."""
        rows = _host(rows)
        if self.store is not None:
            self._set_store(self.store[:, :, torch.from_numpy(rows).to(self.store.device)])
        self._valid, self._pos, self.next_pos = self._valid[rows], self._pos[rows], self.next_pos[rows]
        self.batch = len(rows)


class _InPlaceLayer(DynamicLayer):
    """Layer ``layer`` of a ``KVCache`` as transformers' cache layer: ``keys``/``values`` are views of
    the slots in use, and ``update`` writes into the reserved ones instead of concatenating."""

    def __init__(self, kv: KVCache, layer: int):
        super().__init__()
        self.kv, self.layer = kv, layer
        if kv.store is not None:
            self.keys, self.values = kv._k[layer][:, :, : kv.length], kv._v[layer][:, :, : kv.length]
            self.device, self.is_initialized = kv.store.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys, self.values = self.kv.write(self.layer, key_states, value_states)
        self.device, self.is_initialized = key_states.device, True
        return self.keys, self.values


def _host(x) -> np.ndarray:
    """A host numpy array of ``x`` (numpy, a list or a torch tensor)."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
