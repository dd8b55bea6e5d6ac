"""The memory-mapped search tables of a build (``tables/``): equal to KenLM, exact under search,
shared between processes, added to old builds once, never left half-written."""

from __future__ import annotations

import itertools
import json
import math
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from latticedraft.lattice import Sausage, rescore
from latticedraft.lattice.lm_tables import lm_arrays
from latticedraft.lattice.search import lm_step
from latticedraft.lm.build import BuildOptions, build
from latticedraft.lm.corpus import read_text, stdlib_split
from latticedraft.lm.ngram import NgramLM
from latticedraft.lm.search_tables import TABLES_DIR, tables_present
from latticedraft.paths import data_dir
from tests.lm.kenlm_ref import kenlm_logp

LN10 = math.log(10.0)
kenlm = pytest.importorskip("kenlm")
CASES = [(o, pr) for o in (3, 4, 5, 6) for pr in (False, True)]


@pytest.fixture(scope="session")
def stdlib_slice(tmp_path_factory) -> Path:
    """~120 KB of standard-library training files (the same code path as the 5 MB slice of
    ``benchmarks/lm_scale.py --slice-mb 5``, smaller so eight builds fit the suite)."""
    d = tmp_path_factory.mktemp("slice")
    size = 0
    for i, f in enumerate(stdlib_split("train")):
        if size > 120_000:
            break
        if 2_000 < f.stat().st_size < 20_000:
            shutil.copy(f, d / f"{i:04d}_{f.name}")
            size += f.stat().st_size
    return d


@pytest.fixture(scope="session")
def builds(tmp_path_factory, stdlib_slice):
    """Builds of orders 3-6, unpruned and pruned (``--prune 0 0 1 1 1 1`` cut to the order), made on demand."""
    root = tmp_path_factory.mktemp("orders")
    made = {}

    def get(order: int, pruned: bool) -> Path:
        if (order, pruned) not in made:
            out = root / f"o{order}{'p' if pruned else ''}"
            build(BuildOptions(corpus=[str(stdlib_slice)], out=out, order=order,
                               prune=[0, 0, 1, 1, 1, 1][:order] if pruned else None,
                               tokenizer=str(data_dir() / "tokenizer"), memory="64M", progress=False,
                               encoding_errors="replace"))
            made[(order, pruned)] = out
        return made[(order, pruned)]

    return get


def _heldout_ids(lm: NgramLM, n_files: int = 3) -> list[list[int]]:
    paras = []
    for f in stdlib_split("heldout")[:n_files]:
        for p in read_text(f, "replace").split("\n\n"):
            ids = lm.tokenizer.encode(p, add_special_tokens=False).ids
            if ids:
                paras.append(ids[:60])
    return paras


def _kenlm_logp(model, hist, toks, order):
    """ln p of ``toks`` after ``hist`` as ``NgramLM.begin`` defines it (``<s>`` before a history
    shorter than n-1)."""
    return kenlm_logp(model, hist, toks, begin=len(hist) < order - 1)


@pytest.mark.slow
@pytest.mark.parametrize("order,pruned", CASES)
def test_mmap_tables_equal_kenlm_full_scores(builds, order, pruned):
    """Per-token scores from the memory-mapped tables (the kernels' own step and ``NgramLM.score``)
    equal KenLM's ``full_scores`` on held-out text within 1e-4 nats."""
    d = builds(order, pruned)
    assert tables_present(d)
    lm = NgramLM.load(d)
    A = lm_arrays(lm.fst)
    assert isinstance(A.costs, np.memmap) and isinstance(lm.fst.arc_cost, np.memmap)  # mapped, not copied
    model = kenlm.Model(str(d / "lm.bin"))
    n = 0
    for ids in _heldout_ids(lm):
        ref = np.array([s[0] for s in model.full_scores(" ".join(map(str, ids)), bos=True, eos=False)]) * LN10
        np.testing.assert_allclose(lm.score(ids), ref, atol=1e-4)
        s = A.start
        mine = []
        for t in ids:
            s, c = lm_step(A, s, t)
            mine.append(-c)
        np.testing.assert_allclose(mine, ref, atol=1e-4)
        n += len(ids)
    assert n > 1000


def _lattices(ids_list, V, rng, n):
    """Small lattices around held-out text: the true token among random ones (h <= 4, k <= 3)."""
    for _ in range(n):
        ids = ids_list[int(rng.integers(len(ids_list)))]
        if len(ids) < 12:
            continue
        t = int(rng.integers(6, len(ids) - 4))
        h, k = int(rng.integers(2, 5)), int(rng.integers(2, 4))
        toks = []
        for j in range(h):
            c = [int(ids[t + j])]
            while len(c) < k:
                x = int(rng.choice(ids)) if rng.random() < 0.7 else int(rng.integers(V))
                if x not in c:
                    c.append(x)
            toks.append(c)
        lps = [np.sort(rng.normal(size=k) - 1.0)[::-1].astype(np.float32) for _ in range(h)]
        yield Sausage.from_ragged(toks, lps), ids[:t]


@pytest.mark.slow
@pytest.mark.parametrize("order,pruned", [(5, False), (5, True), (6, False), (6, True)])
def test_exact_rescoring_with_mmap_tables_equals_brute_force(builds, order, pruned):
    """Orders 5 and 6 (the state dynamic program), histories shorter than, equal to and longer
    than the order, against every path scored by KenLM."""
    d = builds(order, pruned)
    lm = NgramLM.load(d)
    model = kenlm.Model(str(d / "lm.bin"))
    rng = np.random.default_rng(order + 10 * pruned)
    lens = itertools.cycle([0, 2, order - 1, order, order + 3])
    checked = 0
    for s, full in _lattices(_heldout_ids(lm), lm.vocab_size, rng, 40):
        hist = full[len(full) - min(next(lens), len(full)):]
        p = int(rng.integers(1, 7))
        alpha = float(rng.choice([0.5, 1.0, 2.0]))
        d_ = rescore(s, lm, alpha, p, hist)
        keep = hist[-(order - 1):] if order > 1 else []
        ref = sorted(((s.path_logp(np.array(c)) + alpha * _kenlm_logp(
            model, keep, [int(s.tokens[i, j]) for i, j in enumerate(c)], order), c)
            for c in itertools.product(*[range(w) for w in s.widths])), key=lambda x: -x[0])
        np.testing.assert_allclose(d_.scores, [r[0] for r in ref[:len(d_)]], atol=2e-3)
        assert len(d_) == min(p, len(ref))
        checked += 1
    assert checked >= 25


def test_old_build_gets_tables_once_with_a_notice(builds, tmp_path, capsys):
    """A build without ``tables/`` is upgraded on first load (one notice), then mapped."""
    d = tmp_path / "old"
    shutil.copytree(builds(3, True), d)
    shutil.rmtree(d / TABLES_DIR)
    lm = NgramLM.load(d)
    ref = NgramLM.load(builds(3, True))
    ids = _heldout_ids(ref, 1)[0]
    np.testing.assert_array_equal(lm.score(ids), ref.score(ids))
    err = capsys.readouterr().err
    assert err.count(f"{d} has no search tables") == 1 and "latticedraft lm index" in err
    assert tables_present(d)
    NgramLM.load(d).score(ids)
    assert capsys.readouterr().err == ""  # second load: mapped, nothing rebuilt


def test_tables_of_an_older_layout_are_rewritten_once(builds, tmp_path, capsys):
    """Tables of layout version 1 (no ``state_rec``) count as absent: rewritten on first load."""
    d = tmp_path / "v1"
    shutil.copytree(builds(3, True), d)
    meta_path = d / TABLES_DIR / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["version"] = 1
    meta_path.write_text(json.dumps(meta))
    (d / TABLES_DIR / "state_rec.npy").unlink()
    lm = NgramLM.load(d)
    ids = _heldout_ids(lm, 1)[0]
    np.testing.assert_array_equal(lm.score(ids), NgramLM.load(builds(3, True)).score(ids))
    assert capsys.readouterr().err.count(f"{d} has no search tables of this version") == 1
    assert tables_present(d) and (d / TABLES_DIR / "state_rec.npy").is_file()


def test_state_records_pack_the_state_arrays(builds):
    """``state_rec`` (one 16-byte read per state for the state program) holds each state's arc
    range, back-off state and back-off cost, memory-mapped like the other tables."""
    A = lm_arrays(NgramLM.load(builds(5, False)).fst)
    rec, recf = A.state_args()
    assert isinstance(A.state_rec, np.memmap) and np.shares_memory(rec, recf)
    np.testing.assert_array_equal(rec[0::4], A.offsets[:-1])
    np.testing.assert_array_equal(rec[1::4], A.offsets[1:])
    np.testing.assert_array_equal(rec[2::4], A.bo_next)
    np.testing.assert_array_equal(recf[3::4], A.bo_cost)


def test_lm_index_verb(builds, tmp_path, capsys):
    from latticedraft.cli import main

    d = tmp_path / "old"
    shutil.copytree(builds(3, True), d)
    shutil.rmtree(d / TABLES_DIR)
    assert main(["lm", "index", str(d)]) == 0
    assert f"wrote {d}/tables" in capsys.readouterr().out and tables_present(d)
    before = (d / TABLES_DIR / "meta.json").stat().st_mtime_ns
    assert main(["lm", "index", str(d)]) == 0
    assert "already present" in capsys.readouterr().out
    assert (d / TABLES_DIR / "meta.json").stat().st_mtime_ns == before
    assert main(["lm", "index", str(tmp_path / "nothing")]) != 0
    assert "does not exist" in capsys.readouterr().err


_TOUCH = textwrap.dedent("""
    import re, sys, numpy as np
    from latticedraft.lm.ngram import NgramLM
    from latticedraft.lattice.lm_tables import lm_arrays
    lm = NgramLM.load(sys.argv[1])
    A = lm_arrays(lm.fst)
    arrs = [A.offsets, A.labels, A.costs, A.nexts, A.bo_next, A.bo_cost, A.arc_hash]
    total = sum(float(np.asarray(a, dtype=np.float64).sum()) for a in arrs)  # read every page
    kb = {"Shared_Clean": 0, "Shared_Dirty": 0, "Private_Clean": 0, "Private_Dirty": 0, "Rss": 0}
    cur = None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's header: address range ... [path]
            cur = len(head) >= 6 and "/tables/" in head[5]
        elif cur and head and head[0].rstrip(":") in kb:
            kb[head[0].rstrip(":")] += int(head[1])
    print("READY", sum(a.nbytes for a in arrs) // 1024, kb, flush=True)
    sys.stdin.readline()
""")


@pytest.mark.slow
def test_two_processes_share_the_table_pages(builds):
    """The second process reading every page of the mapped tables holds them as shared clean
    pages (page cache), not private copies: its private memory grows by far less than the tables."""
    d = builds(5, False)
    cmd = [sys.executable, "-c", _TOUCH, str(d)]
    first = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = first.stdout.readline()
        assert line.startswith("READY"), line
        second = subprocess.run(cmd, input="\n", capture_output=True, text=True, timeout=120)
        assert second.returncode == 0, second.stderr
        size_kb, kb = second.stdout.split(None, 2)[1:]
        size_kb, kb = int(size_kb), eval(kb)  # noqa: S307 - our own dict literal
        assert size_kb > 1000
        assert kb["Rss"] >= 0.9 * size_kb  # every page was read ...
        # ... and is shared with the first process: page-cache pages, dirty while a fresh build's
        # files are not yet written back to disk, clean after
        assert kb["Shared_Clean"] + kb["Shared_Dirty"] >= 0.9 * size_kb, (line, second.stdout)
        assert kb["Private_Clean"] + kb["Private_Dirty"] <= 0.1 * size_kb
    finally:
        first.communicate("\n", timeout=60)


def test_interrupted_table_writing_leaves_nothing(builds, tmp_path, monkeypatch, stdlib_slice):
    """KeyboardInterrupt (SIGINT) while the tables are written: no output, no temporary files,
    an existing build of the same name untouched."""
    import latticedraft.lm.search_tables as st

    out = tmp_path / "lm"
    shutil.copytree(builds(3, True), out)
    before = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")}
    calls = {"n": 0}
    real_save = np.save

    def interrupted_save(path, arr):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        real_save(path, arr)

    monkeypatch.setattr(st.np, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        build(BuildOptions(corpus=[str(stdlib_slice)], out=out, order=3, tokenizer=str(data_dir() / "tokenizer"),
                           memory="64M", progress=False, encoding_errors="replace", force=True))
    assert calls["n"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm"]  # no .lm.building-* left
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")} == before


@pytest.mark.slow
def test_sigint_during_lmplz_leaves_nothing(builds, tmp_path, stdlib_slice):
    """SIGINT to ``latticedraft lm build`` while lmplz runs (its child process seen in /proc):
    non-zero exit, no partial output or temporary directory, the existing build untouched."""
    import os
    import signal
    import time

    out = tmp_path / "lm"
    shutil.copytree(builds(3, True), out)
    before = {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")}
    big = tmp_path / "corpus"
    big.mkdir()
    for f in stdlib_split("train")[:150]:  # enough text that lmplz (order 6) runs for a while
        shutil.copy(f, big / f"{len(list(big.iterdir())):04d}.py")
    proc = subprocess.Popen([sys.executable, "-m", "latticedraft", "lm", "build", "--corpus", str(big), "--out",
                             str(out), "--order", "6", "--tokenizer", str(data_dir() / "tokenizer"), "--memory",
                             "64M", "--encoding-errors", "replace", "--force"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a child inherits an ignored SIGINT (and Python then keeps ignoring it): after
                            # other tests in the same process the disposition is not guaranteed to be default
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = False
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not seen:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    stat = open(f"/proc/{pid}/stat").read()
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid and b"lmplz" in cmd:
                    seen = True
                    break
        time.sleep(0.02)
    assert seen, "lmplz never ran"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    time.sleep(0.2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "lm"], err
    for pid in filter(str.isdigit, os.listdir("/proc")):  # lmplz was stopped too
        try:
            assert str(tmp_path).encode() not in open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            pass
    assert {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")} == before
