"""The bfloat16-screened argmax equals the float32 projection's argmax: peaked and flat states,
near ties and exact ties (lowest token id), a vocabulary that is not a whole number of blocks,
non-finite states; the error bound it rests on holds; the float32-accumulation probe rejects a
matmul that sums in bfloat16; and greedy decoding through the screen equals ``generate``."""

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from latticedraft.gpu.verify import screened_argmax as sa
from latticedraft.gpu.verify.verifier import Verifier
from tests.decoding.tiny import prompts, reference, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NEEDS_BF16 = pytest.mark.skipif(not sa.screening_ok("cpu"), reason="no float32-accumulating bfloat16 matmul here")


def _head(vocab=1000, hidden=64, seed=0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    lm = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():  # norms that differ from row to row, as trained output embeddings' do
        lm.weight.mul_(torch.rand(vocab, 1) * 3 + 0.2)
    return lm


def _states(lm, m, seed, peaked=True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = lm.weight.detach()
    x = torch.randn(m, w.shape[1], generator=g) * 3
    if peaked:  # towards one token's embedding: a confident model's final state
        x = x + 4 * w[torch.randint(0, w.shape[0], (m,), generator=g)]
    return x


@NEEDS_BF16
@pytest.mark.parametrize("peaked", [True, False], ids=["peaked", "flat"])
@pytest.mark.parametrize("m", [1, 2, 7, 33, 70])
def test_screened_equals_float32_argmax(m, peaked):
    lm = _head()  # 1000 tokens: the last block is padding
    ap = sa.ArgmaxProjection(lm)
    assert ap.screens and ap.blocks * sa.BLOCK > ap.vocab
    with torch.no_grad():
        for seed in range(5):
            x = _states(lm, m, seed, peaked)
            assert np.array_equal(ap.screened(x), lm(x).argmax(-1).numpy())


@NEEDS_BF16
def test_rows_where_bfloat16_alone_picks_wrong_are_settled_in_float32():
    lm = _head(vocab=2000, hidden=128)
    ap = sa.ArgmaxProjection(lm)
    with torch.no_grad():
        x = torch.cat([_states(lm, 200, seed, peaked=False) for seed in range(5)])
        ref = lm(x).argmax(-1).numpy()
        naive = F.linear(x.bfloat16(), lm.weight.bfloat16()).float().argmax(-1).numpy()
        assert (naive != ref).sum() >= 5  # the case the screen exists for
        assert np.array_equal(ap.screened(x), ref)


@NEEDS_BF16
def test_near_and_exact_ties_go_to_the_float32_logits_and_the_lowest_id():
    lm = _head(vocab=300)
    with torch.no_grad():
        w = lm.weight
        big = 2 * w.norm(dim=-1).max()
        w[250] *= big / w[250].norm()
        w[20] *= big / w[20].norm()
        w[7] = w[250]  # an exact tie: 7 wins, as torch.argmax picks the first maximum
        w[100] = w[20] * (1 + 2 ** -20)  # a near tie far below bfloat16's resolution
        ap = sa.ArgmaxProjection(lm)
        x = torch.stack([w[250], w[20], -w[20], w[7] + w[100], w[20] + 1e-3 * w[5]])
        ref = lm(x).argmax(-1).numpy()
        assert ref[0] == 7 and ref[1] in (20, 100)
        assert np.array_equal(ap.screened(x), ref)


@NEEDS_BF16
def test_non_finite_states_take_the_float32_path():
    lm = _head(vocab=200)
    ap = sa.ArgmaxProjection(lm)
    with torch.no_grad():
        x = _states(lm, 3, 0)
        x[1, 0] = float("nan")
        x[2, 0] = float("inf")
        assert np.array_equal(ap.screened(x), lm(x).argmax(-1).numpy())


@NEEDS_BF16
def test_the_error_bound_holds():
    lm = _head(vocab=4096, hidden=256)
    ap = sa.ArgmaxProjection(lm)
    w = lm.weight.detach()
    with torch.no_grad():
        for peaked in (True, False):
            x = _states(lm, 64, 1, peaked)
            z = lm(x)
            zb = F.linear(x.bfloat16(), w.bfloat16()).float()
            bound = ap.a * x.norm(dim=-1, keepdim=True) * w.norm(dim=-1) + ap.b * zb.abs()
            assert ((zb - z).abs() <= bound).all()
            assert ((zb - z).abs() > 0.05 * bound).any()  # the bound is not vacuous


def test_what_is_not_screened():
    with torch.no_grad():
        assert not sa.ArgmaxProjection(torch.nn.Linear(8, 50, bias=True)).screens
        assert not sa.ArgmaxProjection(torch.nn.Linear(8, 50, bias=False).double()).screens
        f = sa.argmax_projection(lambda h: h @ torch.ones(8, 5))
        assert not f.screens
        assert f(torch.eye(8)[:3] * torch.arange(1, 4)[:, None]).tolist() == [0, 0, 0]


def test_the_probe_rejects_a_matmul_that_sums_in_bfloat16(monkeypatch):
    def bf16_sum(h, w):  # products summed one by one in bfloat16
        out = torch.zeros(h.shape[0], w.shape[0], dtype=torch.bfloat16)
        for i in range(h.shape[1]):
            out = out + h[:, i:i + 1] * w[:, i][None]
        return out

    monkeypatch.setattr(sa, "_OK", {})
    monkeypatch.setattr(sa.F, "linear", bf16_sum)
    assert not sa.screening_ok("cpu")
    monkeypatch.undo()
    assert not sa.screening_ok("meta")


@NEEDS_BF16
def test_calibrate_measures_once_per_thread_count_and_turns_a_slower_screen_off(monkeypatch):
    lm = _head(vocab=8192, hidden=128)
    ap = sa.ArgmaxProjection(lm)
    real = ap.screened
    monkeypatch.setattr(ap, "screened", lambda h: (time.sleep(0.002), real(h))[1])  # a machine where it is slower
    with torch.no_grad():
        ap.calibrate(_states(lm, 16, 0), rows=(2, 16), repeats=3)
        assert ap.max_rows == 0
        x = _states(lm, 4, 1)
        calls = []
        monkeypatch.setattr(ap, "screened", lambda h: calls.append(h) or real(h))
        assert np.array_equal(ap(x), lm(x).argmax(-1).numpy()) and not calls  # the float32 path
        ap.max_rows = float("inf")
        ap.calibrate(None)  # measured already at this thread count: not again
        assert ap.max_rows == float("inf")
        assert np.array_equal(ap(x[:1]), lm(x[:1]).argmax(-1).numpy()) and len(calls) == 1  # one row: screened


def test_one_projection_per_module_until_its_weights_change():
    lm = _head(vocab=100)
    a = sa.argmax_projection(lm)
    assert sa.argmax_projection(lm) is a
    with torch.no_grad():
        lm.weight.mul_(2)
    assert sa.argmax_projection(lm) is not a


@NEEDS_BF16
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_greedy_verification_through_the_screen_equals_generate(arch, monkeypatch):
    monkeypatch.setattr(sa.ArgmaxProjection, "calibrate", lambda self, *a, **k: None)  # screened, whatever its speed
    model = tiny_model(arch, torch.float32, vocab=300)
    ps = prompts(3, seed=5, vocab=300)
    refs = [reference(model, p, 20) for p in ps]
    v = Verifier(model, "tree")
    calls = []
    real = sa.ArgmaxProjection.screened
    monkeypatch.setattr(sa.ArgmaxProjection, "screened", lambda self, h: calls.append(len(h)) or real(self, h))
    state, roots, _ = v.prefill(ps)
    out = [[int(r)] for r in roots]
    rng = np.random.default_rng(0)
    while min(len(o) for o in out) < 20:
        drafts = []
        for i in range(3):
            cont = np.asarray(refs[i][len(out[i]):len(out[i]) + 4], dtype=np.int64)
            d = rng.integers(0, 300, size=(3, 4))
            d[0, :len(cont)] = cont
            d[0, int(rng.integers(0, 4))] = (d[0, 0] + 1) % 300  # wrong somewhere along the way
            drafts.append(d)
        res = v.verify(state, np.array([o[-1] for o in out]), drafts)
        for i in range(3):
            out[i] += res.accepted[i].tolist() + [int(res.bonus[i])]
    assert calls and max(calls) > 1
    for o, r in zip(out, refs):
        assert o[:20] == r[:20]
