"""The numpy OpenFst writer produces the bytes pywrapfst writes, and OpenFst reads them back."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
import pywrapfst

from latticedraft.lm import openfst_binary as ob

# a 3-state acceptor: state 0 --eps/0.5--> 2; 0 --1/1.25--> 1; 0 --4/2.0--> 2; 1 --2/0.75--> 0; 1 --eps/0.25--> 2
START = 1
FINAL = np.array([np.inf, 0.0, 1.5], dtype=np.float32)
OFFS = np.array([0, 2, 3, 3], dtype=np.int64)
LAB = np.array([1, 4, 2], dtype=np.int32)
COST = np.array([1.25, 2.0, 0.75], dtype=np.float32)
NEXT = np.array([1, 2, 0], dtype=np.int32)
EPS_NEXT = np.array([2, 2, -1], dtype=np.int32)
EPS_COST = np.array([0.5, 0.25, 0.0], dtype=np.float32)


def _ours(block_arcs=1 << 18) -> bytes:
    buf = io.BytesIO()
    props = ob.acceptor_properties(ilabels_sorted=True, has_epsilons=True, weighted=True, deterministic=True)
    ob.write_acceptor(buf, start=START, final=FINAL, state_offsets=OFFS, labels=LAB, costs=COST, nexts=NEXT,
                      eps_next=EPS_NEXT, eps_cost=EPS_COST, properties=props, block_arcs=block_arcs)
    return buf.getvalue()


def _pywrapfst(path) -> pywrapfst.VectorFst:
    f = pywrapfst.VectorFst()
    w = lambda x: pywrapfst.Weight(f.weight_type(), float(x))  # noqa: E731
    for _ in range(3):
        f.add_state()
    f.set_start(START)
    for s in range(3):
        if np.isfinite(FINAL[s]):
            f.set_final(s, w(FINAL[s]))
        if EPS_NEXT[s] >= 0:
            f.add_arc(s, pywrapfst.Arc(0, 0, w(EPS_COST[s]), int(EPS_NEXT[s])))
        for a in range(OFFS[s], OFFS[s + 1]):
            f.add_arc(s, pywrapfst.Arc(int(LAB[a]), int(LAB[a]), w(COST[a]), int(NEXT[a])))
    f.arcsort()
    f.write(str(path))
    return f


@pytest.mark.parametrize("block_arcs", [1, 2, 1 << 18])
def test_bytes_equal_pywrapfst_except_properties(tmp_path, block_arcs):
    ref = tmp_path / "ref.fst"
    f = _pywrapfst(ref)
    theirs, ours = ref.read_bytes(), _ours(block_arcs)
    assert len(ours) == len(theirs)
    h = ob.read_header(ref)
    prop_at = 4 + (4 + 6) + (4 + 8) + 4 + 4  # magic, "vector", "standard", version, flags
    assert ours[:prop_at] == theirs[:prop_at]
    assert ours[prop_at + 8 :] == theirs[prop_at + 8 :]
    # every property bit we claim, OpenFst computes as true
    (ours_props,) = np.frombuffer(ours[prop_at : prop_at + 8], dtype="<u8")
    computed = f.properties(pywrapfst.FST_PROPERTIES, True).value
    assert int(ours_props) & ~computed == 0
    assert h["magic"] == ob.FST_MAGIC and h["fst_type"] == "vector" and h["arc_type"] == "standard"
    assert (h["version"], h["num_states"], h["num_arcs"], h["start"]) == (2, 3, 0, START)  # as OpenFst writes


def test_pywrapfst_and_fstinfo_read_ours(tmp_path):
    p = tmp_path / "ours.fst"
    p.write_bytes(_ours())
    f = pywrapfst.Fst.read(str(p))
    assert f.num_states() == 3 and f.start() == START
    arcs = [(a.ilabel, float(a.weight), a.nextstate) for a in f.arcs(0)]
    assert arcs == [(0, 0.5, 2), (1, 1.25, 1), (4, 2.0, 2)]
    assert float(f.final(2)) == 1.5
    if shutil.which("fstinfo") is None:
        pytest.skip("fstinfo (Debian libfst-tools) not installed")
    info = subprocess.run(["fstinfo", str(p)], capture_output=True, text=True, check=True).stdout
    assert "# of states                                       3" in info
    assert "# of arcs                                         5" in info
    assert "input label sorted                                y" in info
