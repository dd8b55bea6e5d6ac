"""Sausage construction, queries, files and the OpenFST text form."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from latticedraft.errors import InputError
from latticedraft.lattice.sausage import PAD_TOKEN, Sausage, load_npz


def test_from_logits_is_log_softmax_over_the_full_vocabulary_then_top_k():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50)).astype(np.float32) * 3
    s = Sausage.from_logits(logits, 4)
    full = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    ref_tok = np.argsort(-logits, axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(s.tokens, ref_tok)
    np.testing.assert_allclose(s.logp, np.take_along_axis(full, ref_tok, 1), atol=1e-5)
    assert s.tokens.dtype == np.int64 and s.logp.dtype == np.float32
    assert (np.diff(s.logp, axis=1) <= 0).all()
    np.testing.assert_array_equal(s.top1(), logits.argmax(1))
    assert s.num_paths() == 4**3 and s.h == 3 and s.k == 4


def test_from_logits_accepts_torch_and_batches():
    t = torch.randn(2, 3, 20, dtype=torch.bfloat16)
    batch = Sausage.from_logits_batch(t, 5)
    one = Sausage.from_logits(t[1], 5)
    np.testing.assert_array_equal(batch[1].tokens, one.tokens)
    np.testing.assert_allclose(batch[1].logp, one.logp)


@pytest.mark.parametrize("bad,word", [(np.nan, "NaN"), (np.inf, "inf")])
def test_non_finite_logits_name_the_slot(bad, word):
    x = np.zeros((4, 10))
    x[2, 7] = bad
    with pytest.raises(InputError, match=rf"{word} at slot \(2\) token 7"):
        Sausage.from_logits(x, 3)


def test_k_and_h_are_checked():
    with pytest.raises(InputError, match="k = 11 is outside 1..10"):
        Sausage.from_logits(np.zeros((2, 10)), 11)
    with pytest.raises(InputError, match="h = 0"):
        Sausage.from_logits(np.zeros((0, 10)), 2)
    with pytest.raises(InputError, match="k = 0"):
        Sausage.from_logits(np.zeros((2, 10)), 0)


def test_ragged_truncate_and_validation():
    s = Sausage.from_ragged([[5, 3], [1], [2, 4, 6]], [[-2.0, -0.5], [-0.1], [-1, -3, -2]])
    np.testing.assert_array_equal(s.widths, [2, 1, 3])
    np.testing.assert_array_equal(s.tokens[0], [3, 5, PAD_TOKEN])  # sorted best first, padded
    assert s.num_paths() == 6
    assert s.truncate(2).h == 2 and s.truncate(9).h == 3
    with pytest.raises(InputError, match="depth 0"):
        s.truncate(0)
    with pytest.raises(InputError, match="twice"):
        Sausage.from_ragged([[1, 1]], [[-1.0, -2.0]])
    with pytest.raises(InputError, match="empty"):
        Sausage(np.array([[PAD_TOKEN]]), np.array([[-np.inf]]))


def test_save_load_round_trip_is_atomic(tmp_path):
    s = Sausage.from_logits(np.random.default_rng(1).normal(size=(3, 12)), 4)
    path = s.save(tmp_path / "lat.npz", reference=np.array([1, 2, 3]))
    t, extra = load_npz(path)
    np.testing.assert_array_equal(t.tokens, s.tokens)
    np.testing.assert_array_equal(t.logp, s.logp)
    np.testing.assert_array_equal(extra["reference"], [1, 2, 3])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lat.npz"]  # no temporary left
    with pytest.raises(InputError, match="does not exist"):
        Sausage.load(tmp_path / "missing.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="junk.npz"):
        Sausage.load(tmp_path / "junk.npz")


@pytest.mark.skipif(shutil.which("fstcompile") is None, reason="libfst-tools not installed")
def test_fst_text_compiles_with_fstcompile(tmp_path):
    s = Sausage.from_ragged([[4, 0], [7], [1, 2]], [[-0.25, -1.5], [-0.01], [-0.7, -0.9]])
    txt = tmp_path / "lat.txt"
    txt.write_text(s.to_fst_text())
    out = tmp_path / "lat.fst"
    subprocess.run(["fstcompile", "--acceptor", str(txt), str(out)], check=True)
    info = subprocess.run(["fstinfo", str(out)], check=True, capture_output=True, text=True).stdout
    fields = {l.split("  ")[0].strip(): l.split()[-1] for l in info.splitlines() if l.strip()}
    assert fields["# of states"] == "4" and fields["# of arcs"] == "5"
    assert fields["acceptor"] == "y"
