"""``latticedraft lm build`` / ``lm score`` through the real console entry (subprocess)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import kenlm
import pytest

LN10 = math.log(10)


def _cli(*args, check=False):
    return subprocess.run([sys.executable, "-m", "latticedraft", "lm", *map(str, args)], capture_output=True,
                          text=True, check=check)


@pytest.mark.slow
def test_build_then_score_by_text_and_ids(tmp_path, corpus_file):
    out = tmp_path / "D"
    r = _cli("build", "--corpus", corpus_file, "--train-tokenizer", 300, "--order", 3, "--out", out,
             "--memory", "64M")
    assert r.returncode == 0, r.stderr
    assert "built 3-gram LM" in r.stdout
    # stderr is not a terminal: no progress bar, but one line per stage with its counts and times
    lines = r.stderr.splitlines()
    assert "\r" not in r.stderr and all(line.startswith("lm build: ") and "elapsed" in line for line in lines)
    stages = [line.split(":")[1].strip() for line in lines]
    assert stages == ["tokenizer", "tokenized", "lmplz", "WFST", "search tables", "build_binary"], lines
    assert f"{json.loads((out / 'manifest.json').read_text())['corpus']['tokens']} tokens," in lines[1]
    r = _cli("score", "--lm", out, "--text", "def alpha(beta):\n    return beta", "--compact", check=True)
    doc = json.loads(r.stdout)
    ids = [t["id"] for t in doc["tokens"]]
    model = kenlm.Model(str(out / "lm.bin"))
    ken = [p * LN10 for p, _, _ in model.full_scores(" ".join(map(str, ids)), bos=True, eos=False)]
    assert [t["logprob"] for t in doc["tokens"]] == pytest.approx(ken, abs=1e-4)
    assert doc["total_logprob"] == pytest.approx(sum(ken), abs=1e-3)
    r = _cli("score", "--lm", out, "--ids", *ids[2:], "--history", *ids[:2], check=True)
    assert [t["logprob"] for t in json.loads(r.stdout)["tokens"]] == pytest.approx(ken[2:], abs=1e-4)
    # a second build into the same directory fails with one clear line and leaves it intact
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    r = _cli("build", "--corpus", corpus_file, "--train-tokenizer", 300, "--order", 3, "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "already holds an LM build" in r.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


@pytest.mark.parametrize("args,msg", [
    (["build", "--corpus", "/nonexistent/c.txt", "--train-tokenizer", "300", "--out", "{tmp}/x"], "does not exist"),
    (["build", "--corpus", "{corpus}", "--train-tokenizer", "300", "--order", "9", "--out", "{tmp}/x"], "outside 2..6"),
    (["score", "--lm", "{tmp}/none", "--ids", "1"], "does not exist"),
])
def test_errors_are_one_line(tmp_path, corpus_file, args, msg):
    r = _cli(*[a.format(tmp=tmp_path, corpus=corpus_file) for a in args])
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and msg in r.stderr
    assert "Traceback" not in r.stderr


def test_convert_and_its_errors(tmp_path, tiny_arpa):
    out = tmp_path / "lm.fst"
    r = _cli("convert", tiny_arpa, "--out", out, "--vocab-size", 5)
    assert r.returncode == 0, r.stderr
    assert "7 states" in r.stdout and out.is_file() and out.with_suffix(".npz").is_file()
    r = _cli("convert", tiny_arpa, "--out", out)
    assert r.returncode == 2 and "already holds an OpenFst LM (lm.fst); pass --force" in r.stderr
    bad = tmp_path / "bad.arpa"
    bad.write_text(tiny_arpa.read_text().replace("-0.9\t0 1\t-0.15", "-0.9\t0 x\t-0.15"))
    r = _cli("convert", bad, "--out", tmp_path / "bad.fst")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "bad.arpa, line 18: a word that is neither a token id" in r.stderr
    assert not (tmp_path / "bad.fst").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
