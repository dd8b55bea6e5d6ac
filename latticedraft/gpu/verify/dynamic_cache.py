"""The batched verification fallback's KV cache: a transformers ``DynamicCache`` with per-row slot
bookkeeping (drafts as batch rows over copies of the cache). That fallback serves models whose
attention takes no custom 4-D mask (flash attention, mixed sliding/full layers): they build their
masks from transformers' own cache, so it stays one. Every layer latticedraft runs itself (tree
and split verification, PPD, Kangaroo, the incremental LM) keeps the preallocated ``kv.KVCache``.

``SlotCache`` records, for each batch row and cache slot, whether the slot holds a real token
(``valid``) and its position id (``pos``). Rows of one batch accept different numbers of draft
tokens; the cache keeps one common length and marks the surplus slots invalid, so they are
masked out of every later attention. Keys/values are tensors ``[b, heads, L, head_dim]`` in
``cache.layers[i]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from latticedraft.errors import InputError


@dataclass
class SlotCache:
    """cache: DynamicCache with L slots; valid: bool[b, L]; pos: int64[b, L] (-1 where invalid);
    next_pos: int64[b], the position id the next token of each row gets."""

    cache: DynamicCache
    valid: torch.Tensor
    pos: torch.Tensor
    next_pos: torch.Tensor

    @classmethod
    def empty(cls, batch: int, device: torch.device | str = "cpu") -> "SlotCache":
        return cls(
            cache=DynamicCache(),
            valid=torch.zeros(batch, 0, dtype=torch.bool, device=device),
            pos=torch.zeros(batch, 0, dtype=torch.long, device=device),
            next_pos=torch.zeros(batch, dtype=torch.long, device=device),
        )

    def nbytes(self) -> int:
        """Bytes held by the keys and values of every layer."""
        return cache_bytes(self.cache)

    def appended(self, start: int) -> int:
        """Slots the last forward appended after ``start``."""
        layers = self._layers()
        return int(layers[0].keys.shape[2]) - start if layers else 0

    @property
    def length(self) -> int:
        return int(self.valid.shape[1])

    @property
    def batch(self) -> int:
        return int(self.valid.shape[0])

    def _layers(self):
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]

    def commit(self, start: int, keep: torch.Tensor, keep_valid: torch.Tensor, prefix: bool | None = None) -> None:
        """Keep, of the slots appended after ``start`` by the last forward, those in ``keep``.

        keep: int64[b, m], indices into the appended slots (0 = first appended) in order;
        keep_valid: bool[b, m], False for padding entries (their slots are masked forever).
        Positions of kept valid slots continue ``next_pos``; ``next_pos`` advances by the
        number of valid entries per row. prefix: whether ``keep`` is ``0..m-1`` on every row, all
        valid (computed when None).
        """
        m = keep.shape[1]
        if prefix is None:  # callers that know it (from host-side paths) save two device syncs
            prefix = bool(keep_valid.all()) and bool((keep == torch.arange(m, device=keep.device)).all())
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                if prefix:  # the first m appended slots in order (a chain, or the first draft): a view
                    setattr(layer, name, t[:, :, : start + m, :])
                    continue
                new = t[:, :, start:, :]
                idx = keep[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                setattr(layer, name, torch.cat([t[:, :, :start, :], torch.take_along_dim(new, idx, dim=2)], dim=2))
        offs = torch.cumsum(keep_valid.long(), dim=1) - 1
        new_pos = torch.where(keep_valid, self.next_pos[:, None] + offs, torch.full_like(offs, -1))
        self.valid = torch.cat([self.valid[:, :start], keep_valid], dim=1)
        self.pos = torch.cat([self.pos[:, :start], new_pos], dim=1)
        self.next_pos = self.next_pos + keep_valid.long().sum(dim=1)

    def append_valid(self, valid: torch.Tensor, pos: torch.Tensor) -> None:
        """Record slots the last forward appended without selection (the prefill)."""
        self.valid = torch.cat([self.valid, valid], dim=1)
        self.pos = torch.cat([self.pos, torch.where(valid, pos, torch.full_like(pos, -1))], dim=1)
        self.next_pos = torch.where(valid.any(dim=1), pos.masked_fill(~valid, -1).max(dim=1).values + 1, self.next_pos)

    def left_align(self) -> None:
        """Move each row's valid slots to the right end (invalid ones first, order kept), so
        that slot-index distances equal position distances. The batched fallback needs it:
        there the model builds causal and sliding-window masks from slot indices."""
        order = torch.argsort(self.valid.long(), dim=1, stable=True)
        if bool((order == torch.arange(self.length, device=order.device)[None]).all()):
            return
        for layer in self._layers():
            for name in ("keys", "values"):
                t = getattr(layer, name)
                idx = order[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
                setattr(layer, name, torch.take_along_dim(t, idx, dim=2))
        self.valid = torch.take_along_dim(self.valid, order, dim=1)
        self.pos = torch.take_along_dim(self.pos, order, dim=1)

    def save(self) -> tuple:
        """What ``restore`` needs to undo every later step (the cost model's repeated steps)."""
        return self.length, self.next_pos.clone()

    def restore(self, saved: tuple) -> None:
        length, next_pos = saved
        self.truncate(length)
        self.next_pos = next_pos.clone()

    def select_rows(self, rows) -> None:
        """Keep only batch rows ``rows`` (int64[b'], a tensor or a list), e.g. to drop finished
        sequences or pick the winning draft row after a batched (fallback) verification."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.valid.device)
        for layer in self._layers():
            layer.keys = layer.keys[rows]
            layer.values = layer.values[rows]
        self.valid = self.valid[rows]
        self.pos = self.pos[rows]
        self.next_pos = self.next_pos[rows]

    def append_rows(self, other: "SlotCache") -> None:
        """Add ``other``'s rows after this cache's (prompts admitted into a running batch, each
        prefilled on its own). The shorter side is padded on the left with invalid slots, so
        every row's valid slots stay at the right end (``left_align``)."""
        n = max(self.length, other.length)

        def left(x: torch.Tensor, dim: int, fill) -> torch.Tensor:
            pad = n - x.shape[dim]
            if pad == 0:
                return x
            shape = list(x.shape)
            shape[dim] = pad
            return torch.cat([torch.full(shape, fill, dtype=x.dtype, device=x.device), x], dim=dim)

        mine, theirs = self._layers(), other._layers()
        if len(mine) != len(theirs):
            raise InputError("append_rows: the caches hold different layers")
        for a, b in zip(mine, theirs):
            for name in ("keys", "values"):
                setattr(a, name, torch.cat([left(getattr(a, name), 2, 0), left(getattr(b, name), 2, 0)]))
        self.valid = torch.cat([left(self.valid, 1, False), left(other.valid, 1, False)])
        self.pos = torch.cat([left(self.pos, 1, -1), left(other.pos, 1, -1)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])

    def repeat_rows(self, repeats: int) -> None:
        """Each row ``repeats`` times in a row (rows i*repeats ... i*repeats+repeats-1)."""
        self.select_rows(torch.arange(self.batch, device=self.valid.device).repeat_interleave(repeats))

    def truncate(self, length: int) -> None:
        """Drop slots from ``length`` on (used after a forward whose slots are all discarded)."""
        for layer in self._layers():
            layer.keys = layer.keys[:, :, :length, :]
            layer.values = layer.values[:, :, :length, :]
        self.valid = self.valid[:, :length]
        self.pos = self.pos[:, :length]


def crop_to(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` slots of every initialized layer of a plain ``DynamicCache``."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys is not None:
            layer.keys = layer.keys[:, :, :length, :]
            layer.values = layer.values[:, :, :length, :]


def cache_length(cache: DynamicCache) -> int:
    """Slots held by the first initialized layer (0 for an empty cache)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
            return int(layer.keys.shape[-2])
    return 0


def cache_bytes(cache: DynamicCache) -> int:
    """Bytes of the keys and values held by every initialized layer of a ``DynamicCache``."""
    return sum(t.numel() * t.element_size() for layer in cache.layers
               if getattr(layer, "is_initialized", False) and layer.keys is not None for t in (layer.keys, layer.values))
