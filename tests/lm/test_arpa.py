"""ARPA reader: values, specials, gzip, and malformed files reported with their line number."""

from __future__ import annotations

import gzip
import shutil

import numpy as np
import pytest

from latticedraft.errors import InputError
from latticedraft.lm.arpa import BOS, EOS, UNK, read_arpa


def test_reads_fixture_values_and_specials(tiny_arpa):
    a = read_arpa(tiny_arpa)
    assert a.order == 3 and a.counts == [6, 6, 3]
    uni = a.orders[0]
    assert uni.words[:, 0].tolist() == [UNK, BOS, EOS, 1, 2, 3]  # ids 0,1,2 become codes 1,2,3
    np.testing.assert_allclose(uni.logprob, [-1.5, 0, -0.7, -0.6, -0.8, -1.2], rtol=1e-7)
    np.testing.assert_allclose(uni.backoff, [0, -0.5, 0, -0.3, -0.2, -0.1], rtol=1e-7)
    bi = a.orders[1]
    assert bi.words.tolist()[4] == [2, 3]  # "1 2" with no back-off field
    assert bi.backoff[4] == 0 and bi.first_line == 16  # the file starts with a blank line
    assert a.orders[2].words.tolist()[2] == [1, 2, EOS]


def test_gzip_equals_plain(tiny_arpa, tmp_path):
    gz = tmp_path / "lm.arpa.gz"
    with open(tiny_arpa, "rb") as f, gzip.open(gz, "wb") as g:
        shutil.copyfileobj(f, g)
    a, b = read_arpa(tiny_arpa), read_arpa(gz)
    for x, y in zip(a.orders, b.orders):
        np.testing.assert_array_equal(x.words, y.words)
        np.testing.assert_array_equal(x.logprob, y.logprob)


def test_number_formats(tmp_path):
    p = tmp_path / "n.arpa"
    p.write_text("\\data\\\nngram 1=4\n\n\\1-grams:\n-1.5e-01\t<s>\t-2E1\n-inf\t0\n+0.25\t1\t3\n-7\t</s>\n\n\\end\\\n")
    a = read_arpa(p)
    np.testing.assert_allclose(a.orders[0].logprob, [-0.15, -np.inf, 0.25, -7.0])
    np.testing.assert_allclose(a.orders[0].backoff, [-20.0, 0, 3.0, 0])


BAD = {
    "truncated": ("\\data\\\nngram 1=3\nngram 2=2\n\n\\1-grams:\n-1\t0\t0\n-1\t1\t0\n-1\t<s>\t0\n\n\\2-grams:\n-0.5\t0 1\n",
                  r"line 11: 2-grams section ends after 1 entries but \\data\\ announces 2"),
    "bad number": ("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\t0\t0\n-x.5\t1\t0\n\n\\end\\\n", r"line 6: a probability or back-off that is not a number"),
    "bad word": ("\\data\\\nngram 1=2\n\n\\1-grams:\n-1\t0\t0\n-1\tthe\t0\n\n\\end\\\n", r"line 6: a word that is neither a token id"),
    "missing field": ("\\data\\\nngram 1=1\nngram 2=1\n\n\\1-grams:\n-1\t0\t0\n\n\\2-grams:\n-1\t0\n\n\\end\\\n", r"line 9: wrong number of fields"),
    "too many": ("\\data\\\nngram 1=1\n\n\\1-grams:\n-1\t0\t0\n-1\t1\t0\n\n\\end\\\n", r"line 6: more 1-grams than"),
    "no end": ("\\data\\\nngram 1=1\n\n\\1-grams:\n-1\t0\t0\n", r"no \\end\\ marker"),
    "not arpa": ("hello world\n", r"no \\data\\ section"),
    "extra field": ("\\data\\\nngram 1=1\n\n\\1-grams:\n-1\t0\t0\t7\n\n\\end\\\n", r"line 5: wrong number of fields"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_arpa_names_the_line(tmp_path, name):
    text, msg = BAD[name]
    p = tmp_path / "bad.arpa"
    p.write_text(text)
    with pytest.raises(InputError, match=msg) as e:
        read_arpa(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_truncated_lmplz_arpa(tiny_build, tmp_path):
    """A real ARPA cut in the middle of a line: the error gives the line where it stops."""
    src = (tiny_build / "lm.arpa").read_bytes()
    cut = src[: len(src) * 2 // 3]
    cut = cut[: cut.rindex(b"\t") + 1]  # stop mid-line, after a tab
    p = tmp_path / "cut.arpa"
    p.write_bytes(cut)
    last_line = cut.count(b"\n") + 1
    with pytest.raises(InputError, match=rf"line {last_line}: ") as e:
        read_arpa(p)
    assert "cut.arpa" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_arpa(tmp_path / "nope.arpa")
