"""``gpu/masks.py``: the one visibility rule, the same on the host (numpy) and on the device
(torch), and equal to the rule written out per query and key."""

import numpy as np
import pytest
import torch

from latticedraft.gpu.masks import CAUSAL, attention_bias, causal, causal_mask, visible


def naive(key_valid, key_pos, q_pos, new, window, self_visible):
    b, n = q_pos.shape
    K = key_valid.shape[1]
    out = np.zeros((b, n, K + n), dtype=bool)
    for i in range(b):
        kp = list(key_pos[i]) + list(q_pos[i])
        for q in range(n):
            for k in range(K + n):
                seen = key_valid[i, k] if k < K else new[i, q, k - K]
                inside = window is None or kp[k] > q_pos[i, q] - window
                out[i, q, k] = (seen and inside) or (self_visible and k == K + q)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_visible_is_the_rule_on_host_and_device(seed):
    rng = np.random.default_rng(seed)
    b, K, n = 1 + seed % 3, seed % 6, 1 + seed % 5
    key_valid = rng.random((b, K)) < 0.7
    key_pos = np.sort(rng.integers(0, 20, (b, K)), axis=1)
    q_pos = key_pos.max(axis=1, initial=0)[:, None] + 1 + np.arange(n)[None]
    new = rng.random((b, n, n)) < 0.5
    window = None if seed % 2 else 4
    for self_visible in (True, False):
        want = naive(key_valid, key_pos, q_pos, new, window, self_visible)
        got = visible(key_valid, key_pos, q_pos, new, window, self_visible)
        dev = visible(*(torch.as_tensor(x) for x in (key_valid, key_pos, q_pos, new)), window, self_visible)
        assert np.array_equal(got, want) and np.array_equal(dev.numpy(), want)


def test_causal_hides_padding_and_the_future():
    valid = np.array([[False, True, True]])
    want = np.array([[[False, False, False], [False, True, False], [False, True, True]]])
    assert np.array_equal(causal(valid), want)
    assert np.array_equal(causal(torch.as_tensor(valid)).numpy(), want)


@pytest.mark.parametrize("start,n,window", [(0, 1, None), (5, 1, None), (3, 4, None), (6, 3, 4), (2, 1, 4), (9, 1, 4),
                                            (0, 5, None), (0, 3, 4), (0, 6, 4)])
def test_causal_mask_of_one_sequence(start, n, window):
    m = causal_mask(start, n, window, "cpu")
    q = np.arange(start, start + n)[:, None]
    k = np.arange(start + n)[None]
    want = (k <= q) & (True if window is None else k > q - window)
    if m is None:
        assert want.all()
    elif m is CAUSAL:  # a first call inside the window: attention's causal kernel
        assert start == 0 and n > 1 and np.array_equal(want, np.tri(n, dtype=bool))
    else:
        assert m.shape == (1, 1, n, start + n) and np.array_equal(m[0, 0].numpy(), want)


def test_attention_bias_is_zero_where_visible_and_the_minimum_elsewhere():
    allowed = torch.tensor([[[True, False]]])
    bias = attention_bias(allowed, torch.float16)
    assert bias.shape == (1, 1, 1, 2) and bias[0, 0, 0, 0] == 0 and bias[0, 0, 0, 1] == torch.finfo(torch.float16).min
