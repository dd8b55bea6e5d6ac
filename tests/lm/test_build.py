"""``lm build`` end to end: KenLM agreement, manifest, refusal to overwrite, and every bad input."""

from __future__ import annotations

import gzip
import json
import lzma
import math
import os
import shutil
import stat
import subprocess
import time

import kenlm
import numpy as np
import pytest

from latticedraft.errors import BuildError, InputError, ModelError
from latticedraft.lm.build import BuildOptions, build
from latticedraft.lm.corpus import read_text, resolve_corpus
from latticedraft.lm.ngram import NgramLM
from latticedraft.paths import kenlm_tool
from tests.lm.conftest import synthetic_text

LN10 = math.log(10)


def _opts(corpus, out, **kw) -> BuildOptions:
    kw.setdefault("train_tokenizer", 300)
    kw.setdefault("order", 3)
    return BuildOptions(corpus=[str(c) for c in (corpus if isinstance(corpus, list) else [corpus])], out=out,
                        memory="64M", progress=False, **kw)


def test_kenlm_binary_agrees_with_ngramlm(tiny_build):
    m = json.loads((tiny_build / "manifest.json").read_text())
    assert m["order"] == 3 and m["vocab_size"] == 300 and m["lmplz"]["prune"] == [0, 0, 1]
    assert len(m["ngram_counts"]) == 3 and m["corpus"]["tokens"] > 10000
    assert m["corpus"]["files"][0]["sha256"] and m["tools"]["kenlm"] and m["timings_s"]["lmplz_s"] > 0
    assert m["unk"]["requested_cost"] == 1000.0 and abs(m["unk"]["cost"] - 1000.0) < 1e-3
    assert m["lmplz"]["unk_log10_from_lmplz"] < 0
    model = kenlm.Model(str(tiny_build / "lm.bin"))
    lm = NgramLM.load(tiny_build)
    arpa_vocab = {int(l.split("\t")[1]) for l in open(tiny_build / "lm.arpa") if l.count("\t") >= 1
                  and l.split("\t")[1].strip().isdigit()}
    rng = np.random.default_rng(0)
    n_unseen = 0
    for i in range(50):
        ids = rng.integers(0, 300, size=int(rng.integers(1, 40))).tolist()
        ken = np.array([p for p, _, _ in model.full_scores(" ".join(map(str, ids)), bos=True, eos=False)]) * LN10
        ours = lm.score(ids)
        np.testing.assert_allclose(ours, ken, atol=1e-4, rtol=0)  # every id, seen or not
        unseen = np.array([t not in arpa_vocab for t in ids])
        n_unseen += int(unseen.sum())
        assert np.all(ours[unseen] <= -1000 + 1e-2)  # Appendix D: 1000 nats (plus back-offs)
    assert n_unseen > 0  # the byte alphabet has tokens the corpus never uses
    # re-pricing unseen ids affects only them
    lm50 = NgramLM.load(tiny_build, unk_cost=50.0)
    ids = rng.integers(0, 300, size=200).tolist()
    seen = np.array([t in arpa_vocab for t in ids])
    a, b = lm.score(ids), lm50.score(ids)
    np.testing.assert_array_equal(a[seen], b[seen])
    np.testing.assert_allclose(a[~seen] - b[~seen], -(m["unk"]["cost"] - 50.0), atol=1e-3)
    # history and incremental state API agree with whole-sentence scoring
    ids = rng.integers(0, 300, size=20).tolist()
    whole = lm.score(ids)
    assert lm.score(ids[5:], history=ids[:5]) == pytest.approx(whole[5:], abs=1e-5)
    assert lm.logprob(ids[:7], ids[7]) == pytest.approx(whole[7], abs=1e-5)


def test_fstinfo_reads_the_build(tiny_build):
    if shutil.which("fstinfo") is None:
        pytest.skip("fstinfo (Debian libfst-tools) not installed")
    out = subprocess.run(["fstinfo", str(tiny_build / "lm.fst")], capture_output=True, text=True, check=True).stdout
    m = json.loads((tiny_build / "manifest.json").read_text())
    assert f"# of states                                       {m['fst']['states']}" in out
    assert "input label sorted                                y" in out


def test_second_build_refused_and_leaves_build_intact(tiny_build, corpus_file):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_build.iterdir()}
    with pytest.raises(InputError, match="already holds an LM build.*--force"):
        build(_opts(corpus_file, tiny_build))
    assert {p.name: p.stat().st_mtime_ns for p in tiny_build.iterdir()} == before


def test_force_replaces_and_shared_tokenizer(tmp_path, tiny_build, corpus_file):
    out = tmp_path / "lm"
    build(_opts(corpus_file, out, order=2, train_tokenizer=None, tokenizer=str(tiny_build / "tokenizer.json")))
    m1 = json.loads((out / "manifest.json").read_text())
    assert m1["tokenizer"]["trained"] is False and m1["order"] == 2
    build(_opts(corpus_file, out, order=4, train_tokenizer=None, tokenizer=str(tiny_build), force=True))
    m2 = json.loads((out / "manifest.json").read_text())
    assert m2["order"] == 4 and m2["tokenizer"]["fingerprint"] == m1["tokenizer"]["fingerprint"]
    assert sorted(p.name for p in out.iterdir()) == ["lm.arpa", "lm.bin", "lm.fst", "lm.npz", "manifest.json",
                                                     "tables", "tokenizer.json"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    NgramLM.load(out, tokenizer=tiny_build / "tokenizer.json")  # same vocabulary: accepted


def test_vocabulary_mismatch_at_query_time(tiny_build, tmp_path, corpus_file):
    from latticedraft.lm.tokenizer import train_tokenizer

    other = train_tokenizer([corpus_file], 280)
    with pytest.raises(ModelError, match="different vocabulary.*rebuild the LM"):
        NgramLM.load(tiny_build, tokenizer=other)


def test_gzip_corpus_and_discount_fallback(tmp_path):
    gz = tmp_path / "tiny.txt.gz"
    gz.write_bytes(gzip.compress(b"a b c d\n\ne f g h\n"))
    m = build(_opts(gz, tmp_path / "lm", train_tokenizer=257, order=3))
    assert m["lmplz"]["discount_fallback"] is True  # lmplz asked for it on this tiny corpus
    assert m["corpus"]["tokens"] >= 8


def test_xz_corpus_reads_as_its_text(tmp_path):
    text = "a b c d\n\ne f g h\n\u00e9 x\n"
    xz = tmp_path / "tiny.txt.xz"
    xz.write_bytes(lzma.compress(text.encode()))
    assert read_text(xz) == text
    assert resolve_corpus([str(tmp_path)]) == [xz]  # a directory's .xz files are corpus files too


# ---- bad input ---------------------------------------------------------------------------------

def test_missing_corpus(tmp_path):
    with pytest.raises(InputError, match="nope.txt does not exist"):
        build(_opts(tmp_path / "nope.txt", tmp_path / "lm"))
    assert not (tmp_path / "lm").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_corpus(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("x y z\n")
    p.chmod(0)
    with pytest.raises(InputError, match="not readable"):
        build(_opts(p, tmp_path / "lm"))


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux /proc")
def test_corpus_read_error(tmp_path):
    """/proc/self/mem is a file whose read fails with EIO, even for root."""
    with pytest.raises(InputError, match="/proc/self/mem cannot be read"):
        build(_opts("/proc/self/mem", tmp_path / "lm"))
    assert not (tmp_path / "lm").exists()


@pytest.mark.parametrize("name", ["c.txt.gz", "c.txt.xz"])
def test_unreadable_corpus_archive(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(b"this is not an archive")
    with pytest.raises(InputError, match=rf"{name} cannot be read .*\.gz or \.xz archive"):
        build(_opts(p, tmp_path / "lm"))


def test_empty_corpus(tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("\n\n   \n")
    with pytest.raises(InputError, match="holds no text"):
        build(_opts(p, tmp_path / "lm", train_tokenizer=257))
    assert not (tmp_path / "lm").exists()


def test_corpus_shorter_than_order(tmp_path):
    p = tmp_path / "short.txt"
    p.write_text("ab")
    with pytest.raises(InputError, match="only 2 tokens, fewer than --order 3"):
        build(_opts(p, tmp_path / "lm", train_tokenizer=257))


def test_non_utf8_names_file_and_offset(tmp_path, corpus_file):
    p = tmp_path / "latin1.txt"
    p.write_bytes("caf\u00e9 ok\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1.txt is not UTF-8: invalid byte 0xe9 at byte offset 3.*--encoding-errors replace"):
        build(_opts(p, tmp_path / "lm", train_tokenizer=257))
    p.write_bytes(corpus_file.read_bytes()[:20000] + b"\xff\xfe tail\n")
    m = build(_opts(p, tmp_path / "lm2", train_tokenizer=260, encoding_errors="replace"))
    assert m["corpus"]["encoding_errors"] == "replace"


@pytest.mark.parametrize("order", [1, 7])
def test_order_out_of_range(tmp_path, corpus_file, order):
    with pytest.raises(InputError, match=rf"--order {order} is outside 2..6"):
        build(_opts(corpus_file, tmp_path / "lm", order=order))


def test_bad_prune(tmp_path, corpus_file):
    with pytest.raises(InputError, match="never decrease"):
        build(_opts(corpus_file, tmp_path / "lm", prune=[0, 2, 1]))


def test_non_empty_directory_without_build(tmp_path, corpus_file):
    out = tmp_path / "lm"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    for force in (False, True):  # --force replaces an LM build only, never another directory
        with pytest.raises(InputError, match=r"holds 1 entry \(notes.txt\), not an LM build .*choose a new or empty"):
            build(_opts(corpus_file, out, force=force))
    assert (out / "notes.txt").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["lm"]


def _fake_tool(tmp_path, monkeypatch, name: str, script: str):
    """Put a fake KenLM tool ``name`` (shell script) first; the real other one beside it."""
    d = tmp_path / "fakebin"
    d.mkdir()
    f = d / name
    f.write_text("#!/bin/sh\n" + script + "\n")
    f.chmod(f.stat().st_mode | stat.S_IEXEC)
    other = "build_binary" if name == "lmplz" else "lmplz"
    (d / other).symlink_to(kenlm_tool(other))
    monkeypatch.setenv("LATTICEDRAFT_KENLM_BIN", str(d))


@pytest.mark.parametrize("script,msg", [
    ("kill -9 $$", r"lmplz .* was killed by signal SIGKILL \(SIGKILL usually means .*out-of-memory"),
    ("echo 'std::bad_alloc' >&2; exit 1", r"lmplz .* ran out of memory with --memory 64M"),
    ("echo 'util::ErrnoException: No space left on device in /tmp/x' >&2; exit 1",
     r"lmplz .* ran out of temporary disk space"),
])
def test_lmplz_failures_name_the_step_and_leave_no_build(tmp_path, monkeypatch, corpus_file, script, msg):
    _fake_tool(tmp_path, monkeypatch, "lmplz", script)
    out = tmp_path / "lm"
    with pytest.raises(BuildError, match=msg) as e:
        build(_opts(corpus_file, out))
    assert "\n" not in str(e.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lm")]  # work directory removed


@pytest.mark.parametrize("script,msg", [
    ("kill -9 $$", r"build_binary \(KenLM trie\) was killed by signal SIGKILL"),
    ("echo 'std::bad_alloc' >&2; exit 1", r"build_binary \(KenLM trie\) ran out of memory with --memory 64M"),
])
def test_build_binary_failures_name_the_step_and_leave_no_build(tmp_path, monkeypatch, corpus_file, script, msg):
    """build_binary runs beside the WFST conversion; its failure still stops the build in one line."""
    _fake_tool(tmp_path, monkeypatch, "build_binary", script)
    out = tmp_path / "lm"
    with pytest.raises(BuildError, match=msg) as e:
        build(_opts(corpus_file, out))
    assert "\n" not in str(e.value)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lm")]


def test_interrupt_beside_build_binary_stops_it(tmp_path, monkeypatch, corpus_file):
    """KeyboardInterrupt in the WFST conversion while build_binary still runs: the child is
    killed and reaped, and nothing is left behind."""
    import latticedraft.lm.wfst as wfst

    pid_file = tmp_path / "build_binary.pid"
    _fake_tool(tmp_path, monkeypatch, "build_binary", f"echo $$ > {pid_file}; exec sleep 60")

    def interrupted(*a, **kw):
        for _ in range(500):  # until the child has started
            if pid_file.is_file() and pid_file.read_text().strip():
                break
            time.sleep(0.01)
        raise KeyboardInterrupt

    monkeypatch.setattr(wfst, "arpa_to_fst", interrupted)
    out = tmp_path / "lm"
    with pytest.raises(KeyboardInterrupt):
        build(_opts(corpus_file, out))
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build_binary.pid", "fakebin"]


def test_build_binary_seconds_are_its_own(tmp_path, monkeypatch):
    """The trie's time is its start to its exit, however late the build waits for it."""
    from latticedraft.lm.kenlm_tools import BuildBinaryJob

    _fake_tool(tmp_path, monkeypatch, "build_binary", 'sleep 0.2; touch "$7"')
    job = BuildBinaryJob(tmp_path / "lm.arpa", tmp_path / "lm.bin", "64M", tmp_path)
    try:
        time.sleep(1.5)
        seconds = job.wait()
    finally:
        job.stop()
    assert 0.2 <= seconds < 1.2
    assert (tmp_path / "lm.bin").is_file()


def test_real_lmplz_with_too_little_memory(tmp_path, corpus_file):
    out = tmp_path / "lm"
    with pytest.raises(BuildError, match="lmplz .* needs more sorting memory"):
        build(BuildOptions(corpus=[str(corpus_file)], out=out, order=3, train_tokenizer=300, memory="1K", progress=False))
    assert not out.exists()


def test_missing_temp_dir(tmp_path, corpus_file):
    with pytest.raises(InputError, match="--temp-dir .* is not an existing directory"):
        build(_opts(corpus_file, tmp_path / "lm", temp_dir=tmp_path / "nope"))


def test_fewer_ngrams_than_tokens_is_fine_for_tiny_text(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text(synthetic_text(30, seed=5))
    m = build(_opts(p, tmp_path / "lm", train_tokenizer=260, order=5))
    assert len(m["ngram_counts"]) == 5


def test_default_sentence_unit_follows_most_of_the_corpus(tmp_path):
    """A code corpus with a licence and metadata ``.txt`` stays ``paragraphs`` (as ``lines`` its
    LM would never see a newline token); a corpus that is mostly text is ``lines``."""
    from latticedraft.lm.build import default_sentences

    code = tmp_path / "m.py"
    code.write_text("def f(x):\n    return x\n" * 50)
    lic = tmp_path / "LICENSE.txt"
    lic.write_text("Permission is hereby granted.\n")
    prose = tmp_path / "book.txt"
    prose.write_text("Call me Ishmael.\n" * 500)
    assert default_sentences([code]) == "paragraphs"
    assert default_sentences([code, lic]) == "paragraphs"
    assert default_sentences([code, lic, prose]) == "lines"
    assert default_sentences([lic]) == "lines"

