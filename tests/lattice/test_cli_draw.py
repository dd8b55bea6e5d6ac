"""``latticedraft rescore`` and ``latticedraft lattice draw``: JSON out, one-line errors, PNGs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from latticedraft.cli import main
from latticedraft.errors import InputError
from latticedraft.lattice.draw import draw_lattice, visible
from latticedraft.lattice.rescoring import rescore
from latticedraft.lattice.sausage import Sausage


@pytest.fixture()
def lattice_file(tmp_path, real_lm):
    fst, _, ids = real_lm
    rng = np.random.default_rng(0)
    toks = [[int(ids[20 + j])] + [int(x) for x in rng.choice(ids[:200], 3, replace=False) if x != ids[20 + j]][:2]
            for j in range(4)]
    s = Sausage.from_ragged(toks, [np.sort(-np.abs(rng.normal(size=len(t))) - 0.1)[::-1] for t in toks])
    path = s.save(tmp_path / "lat.npz", reference=ids[20:24], history=ids[17:20])
    return s, path, ids


def test_rescore_prints_the_library_result_as_json(lattice_file, lm_build, capsys):
    from latticedraft.lm.ngram import NgramLM

    s, path, ids = lattice_file
    for method in ("exact", "wfst"):
        assert main(["rescore", "--lm", str(lm_build), "--lattice", str(path), "--alpha", "0.5",
                     "--nbest", "3", "--method", method]) == 0
        out = json.loads(capsys.readouterr().out)
        d = rescore(s, NgramLM.load(lm_build), 0.5, 3, ids[17:20].tolist(), method=method)
        assert out["paths"] == d.tokens.tolist() and out["method"] == method
        np.testing.assert_allclose(out["scores"], d.scores, rtol=1e-6)
        assert out["ms"] > 0 and out["truncated"] is False


def test_rescore_says_when_nbest_exceeds_the_paths(lattice_file, lm_build, capsys):
    s, path, _ = lattice_file
    assert main(["rescore", "--lm", str(lm_build), "--lattice", str(path), "--nbest", "1000",
                 "--history", "1,2,3"]) == 0
    cap = capsys.readouterr()
    assert len(json.loads(cap.out)["paths"]) == s.num_paths()
    assert "only" in cap.err and "paths" in cap.err


def test_rescore_errors_are_one_line(tmp_path, lm_build, capsys):
    assert main(["rescore", "--lm", str(lm_build), "--lattice", str(tmp_path / "nope.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope.npz" in err and err.count("\n") == 1
    assert main(["rescore", "--lm", str(tmp_path), "--lattice", str(tmp_path / "x.npz"), "--history", "a,b"]) == 2
    assert "integers" in capsys.readouterr().err


def test_draw_writes_a_png(lattice_file, lm_build, tmp_path, capsys):
    _, path, _ = lattice_file
    out = tmp_path / "pic" / "lat.png"
    assert main(["lattice", "draw", str(path), "--tokenizer", str(lm_build / "tokenizer.json"), "-o", str(out),
                 "--lm", str(lm_build), "--alpha", "0.5"]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert [p.name for p in out.parent.iterdir()] == ["lat.png"]
    import matplotlib.image as mpimg

    img = mpimg.imread(out)
    assert img.shape[1] > img.shape[0] > 150  # wide: one column per slot
    with pytest.raises(InputError, match="PNG"):
        draw_lattice(Sausage.from_logits(np.zeros((2, 4)), 2), tmp_path / "x.jpg")


def test_visible_marks_whitespace():
    assert visible(" a\n") == "\u2423a\u21b5"
    assert visible("abcdefghijklmnopqrstuvwxyz", 5) == "abcd\u2026"
