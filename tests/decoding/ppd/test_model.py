"""Theorem 4.1 by hand, and the discrete-event simulation against it."""

import numpy as np
import pytest

from latticedraft.decoding.ppd.pipeline import ppd_decode
from latticedraft.decoding.ppd.model import (expected_compute, expected_latency, match_rates, simulate,
                                             simulate_mean)
from latticedraft.errors import InputError
from tests.decoding.tiny import prompts, reference, tiny_model


def test_theorem_4_1_hand_computed():
    # d = 4, dbar = 2, p = 0.5, l = 3: E[N] = 1 + 2 * 0.5 = 2 runs;
    # latency = dbar*l + (d - dbar)*E[N] = 6 + 2*2 = 10 = d l - (d - dbar)(l - 1)p = 12 - 2
    assert expected_latency(4, 2, 0.5, 3) == pytest.approx(10.0)
    # compute = latency + k (d - dbar) l: k = 1 -> 16, k = 3 -> 28
    assert expected_compute(4, 2, 0.5, 1, 3) == pytest.approx(16.0)
    assert expected_compute(4, 2, 0.5, 3, 3) == pytest.approx(28.0)
    # the same case enumerated over the 4 equally likely match patterns of tokens 1 and 2
    lat = [simulate(4, 2, 1, 3, matches=np.array(m + (0,)))[0] for m in [(0, 0), (0, 1), (1, 0), (1, 1)]]
    assert lat == [12.0, 10.0, 10.0, 8.0] and np.mean(lat) == 10.0


@pytest.mark.parametrize("d,dbar,k,p", [(12, 6, 3, 0.6), (24, 16, 5, 0.3), (4, 3, 1, 0.9)])
def test_simulation_matches_formula_within_2_percent(d, dbar, k, p):
    lat, comp = simulate_mean(d, dbar, k, 1000, p, seeds=50)
    assert abs(lat / expected_latency(d, dbar, p, 1000) - 1) < 0.02
    assert abs(comp / expected_compute(d, dbar, p, k, 1000) - 1) < 0.02


def test_simulation_extremes():
    assert simulate(8, 4, 2, 10, matches=np.zeros(10)) == (80.0, 80.0 + 2 * 4 * 10)
    assert simulate(8, 4, 2, 10, matches=np.ones(10))[0] == 8 + 9 * 4
    with pytest.raises(InputError, match="early-exit layer 8"):
        expected_latency(8, 8, 0.5, 10)


def test_match_rates_agree_with_the_decoder():
    m = tiny_model("llama", layers=4, seed=2)
    ps = prompts(3, seed=4)
    seqs = [(np.concatenate([p, reference(m, p, 16)]), len(p)) for p in ps]
    r = match_rates(m, seqs, ks=(1, 3))
    assert r["positions"] == 48
    for dbar in (1, 2, 3):
        dec = ppd_decode(m, ps, dbar=dbar, k=3, max_new_tokens=16)
        # the decoder's hits on tokens 2..16 (token 1 comes from the prefill) are the rate's hits there
        hits = sum(sum(s.accepted_drafts) for s in dec.sequences)
        assert r["rates"][dbar][1] <= r["rates"][dbar][3]
        assert hits <= r["rates"][dbar][3] * 48 <= hits + 3
