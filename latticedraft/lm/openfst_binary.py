"""Write an acceptor from numpy arrays straight into OpenFst's binary ``VectorFst`` format.

Layout (OpenFst ``vector-fst.h`` ``VectorFst::WriteFst`` and ``fst.h`` ``FstHeader::Write``,
all little-endian, checked byte for byte against ``pywrapfst.VectorFst.write`` in the tests)::

    header: int32 magic 2125659606 | string fst type "vector" | string arc type "standard"
            | int32 version 2 | int32 flags 0 | uint64 properties | int64 start
            | int64 num states | int64 num arcs          (string = int32 length + bytes)
    per state: float32 final weight | int64 num arcs
               then per arc: int32 ilabel | int32 olabel | float32 weight | int32 nextstate

The writer is vectorised: states are written in blocks of about ``block_arcs`` arcs, each block
assembled in one int32 buffer (every field is 4 or 8 bytes), so memory stays O(block) on top
of the input arrays and the cost is a few numpy scatters per arc.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

FST_MAGIC = 2125659606
VECTOR_FILE_VERSION = 2

# OpenFst property bits (properties.h); each property has a "true" and a "false" bit,
# and a property with neither bit set is "unknown".
K_EXPANDED = 0x1
K_MUTABLE = 0x2
K_ACCEPTOR = 0x10000
K_I_DETERMINISTIC = 0x40000
K_NON_I_DETERMINISTIC = 0x80000
K_O_DETERMINISTIC = 0x100000
K_EPSILONS = 0x400000
K_NO_EPSILONS = 0x800000
K_I_EPSILONS = 0x1000000
K_NO_I_EPSILONS = 0x2000000
K_O_EPSILONS = 0x4000000
K_NO_O_EPSILONS = 0x8000000
K_I_LABEL_SORTED = 0x10000000
K_O_LABEL_SORTED = 0x40000000
K_WEIGHTED = 0x100000000
K_UNWEIGHTED = 0x200000000


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<i", len(b)) + b


def header_bytes(properties: int, start: int, num_states: int, num_arcs: int) -> bytes:
    return (
        struct.pack("<i", FST_MAGIC)
        + _string("vector")
        + _string("standard")
        + struct.pack("<iiQqqq", VECTOR_FILE_VERSION, 0, properties, start, num_states, num_arcs)
    )


def read_header(path: str | Path) -> dict:
    """Parse the header of an OpenFst binary file: fst_type, arc_type, version, properties, counts."""
    with open(path, "rb") as f:
        data = f.read(256)

    def string(off: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<i", data, off)
        return data[off + 4 : off + 4 + n].decode(), off + 4 + n

    (magic,) = struct.unpack_from("<i", data, 0)
    fst_type, off = string(4)
    arc_type, off = string(off)
    version, flags, props, start, ns, na = struct.unpack_from("<iiQqqq", data, off)
    return dict(magic=magic, fst_type=fst_type, arc_type=arc_type, version=version, flags=flags,
                properties=props, start=start, num_states=ns, num_arcs=na)


def acceptor_properties(ilabels_sorted: bool, has_epsilons: bool, weighted: bool, deterministic: bool) -> int:
    """Property bits we can vouch for; the rest stay "unknown" so OpenFst recomputes them."""
    p = K_EXPANDED | K_MUTABLE | K_ACCEPTOR
    if ilabels_sorted:
        p |= K_I_LABEL_SORTED | K_O_LABEL_SORTED
    if deterministic:
        p |= K_I_DETERMINISTIC | K_O_DETERMINISTIC
    p |= (K_EPSILONS | K_I_EPSILONS | K_O_EPSILONS) if has_epsilons else (K_NO_EPSILONS | K_NO_I_EPSILONS | K_NO_O_EPSILONS)
    if weighted:
        p |= K_WEIGHTED
    return p


def write_acceptor(
    out: BinaryIO,
    *,
    start: int,
    final: np.ndarray,
    state_offsets: np.ndarray,
    labels: np.ndarray,
    costs: np.ndarray,
    nexts: np.ndarray,
    eps_next: np.ndarray,
    eps_cost: np.ndarray,
    properties: int,
    block_arcs: int = 1 << 18,
) -> int:
    """Write a tropical acceptor to the open binary file ``out``; returns bytes written.

    State s has an optional epsilon arc first (``eps_next[s] >= 0``, weight ``eps_cost[s]``),
    then the arcs ``[state_offsets[s], state_offsets[s+1])`` of ``labels``/``costs``/``nexts``.
    final: float32[S] (``inf`` = not final); state_offsets: int64[S+1]; labels, nexts: int32[A];
    costs: float32[A]; eps_next: int32[S]; eps_cost: float32[S].
    """
    S = len(final)
    has_eps = (eps_next >= 0).astype(np.int64)
    n_out = np.diff(state_offsets) + has_eps  # arcs written per state
    # OpenFst's VectorFst leaves the header's arc count at 0 (readers count arcs themselves)
    written = out.write(header_bytes(properties, start, S, 0))
    s0 = 0
    while s0 < S:
        # pick a block of states holding about block_arcs arcs
        a_lo = int(state_offsets[s0])
        s1 = int(np.searchsorted(state_offsets, a_lo + block_arcs, side="right")) - 1
        s1 = min(max(s1, s0 + 1), S)
        buf = _block(s0, s1, final, state_offsets, labels, costs, nexts, eps_next, eps_cost, has_eps, n_out)
        written += out.write(memoryview(buf).cast("B"))
        s0 = s1
    return written


def _block(s0, s1, final, state_offsets, labels, costs, nexts, eps_next, eps_cost, has_eps, n_out) -> np.ndarray:
    """int32 words of states [s0, s1): 3 words per state header + 4 per arc."""
    n = n_out[s0:s1]
    ns = s1 - s0
    # word position of each state's header inside the block
    arcs_before = np.zeros(ns, dtype=np.int64)
    np.cumsum(n[:-1], out=arcs_before[1:])
    pos = 3 * np.arange(ns, dtype=np.int64) + 4 * arcs_before
    buf = np.zeros(int(3 * ns + 4 * n.sum()), dtype=np.int32)
    buf[pos] = np.asarray(final[s0:s1], dtype=np.float32).view(np.int32)
    buf[pos + 1] = n.astype(np.int32)  # low word of int64 num arcs (high word stays 0)
    # epsilon arcs: first arc of the state
    he = has_eps[s0:s1].astype(bool)
    q = pos[he] + 3
    buf[q + 2] = np.asarray(eps_cost[s0:s1][he], dtype=np.float32).view(np.int32)
    buf[q + 3] = eps_next[s0:s1][he]
    # labelled arcs
    a_lo, a_hi = int(state_offsets[s0]), int(state_offsets[s1])
    if a_hi > a_lo:
        counts = np.diff(state_offsets[s0 : s1 + 1])
        src = np.repeat(np.arange(ns, dtype=np.int64), counts)
        local = np.arange(a_hi - a_lo, dtype=np.int64) - (state_offsets[s0:s1] - a_lo)[src]
        q = pos[src] + 3 + 4 * (local + has_eps[s0:s1][src])
        lab = labels[a_lo:a_hi]
        buf[q] = lab
        buf[q + 1] = lab
        buf[q + 2] = np.asarray(costs[a_lo:a_hi], dtype=np.float32).view(np.int32)
        buf[q + 3] = nexts[a_lo:a_hi]
    return buf
