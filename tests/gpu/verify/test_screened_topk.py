"""The bfloat16-screened top-k keeps every token of the float32 projection's k largest logits,
ties at the k-th included, with float32 values; sampling reads ``SparseLogits`` as it reads the
dense logits; and seeded lossless sampling through the screen emits what it emits without it."""

import numpy as np
import pytest
import torch

from latticedraft.decoding.accept.sampling import SamplingOptions
from latticedraft.decoding.methods.bpd_loop import bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.verify import screened_argmax as sa
from latticedraft.gpu.verify import screened_topk as st
from latticedraft.gpu.verify.screened_topk import TopKProjection
from latticedraft.gpu.verify.sparse_logits import SparseLogits
from tests.decoding.tiny import prompts, tiny_model
from tests.gpu.verify.test_screened_argmax import NEEDS_BF16, _head, _states

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _assert_holds_top_k(got, x: torch.Tensor, lm, k: int):
    """got (``SparseLogits``) lists every token whose float32 logit (of states x [m, H]) is >= the
    row's k-th largest, with that logit to float32 rounding (two sums of H products in different
    orders: 2 H 2^-24 |x| . |w|)."""
    z = lm(x)
    tol = 2 * x.shape[1] * 2.0 ** -24 * (x.abs() @ lm.weight.abs().T)
    assert isinstance(got, SparseLogits) and got.shape == tuple(z.shape)
    assert np.all(np.diff(got.rows) >= 0)
    for i in range(len(z)):
        listed = dict(zip(got.tokens[got.rows == i].tolist(), got.values[got.rows == i].tolist()))
        assert len(listed) == int((got.rows == i).sum())  # distinct tokens
        kth = torch.topk(z[i], k).values[-1]
        need = torch.nonzero(z[i] >= kth)[:, 0].tolist()
        assert set(need) <= set(listed)
        for t, v in listed.items():
            assert abs(v - float(z[i, t])) <= float(tol[i, t])


@NEEDS_BF16
@pytest.mark.parametrize("peaked", [True, False], ids=["peaked", "flat"])
@pytest.mark.parametrize("m,k", [(1, 50), (3, 5), (7, 50), (33, 200)])
def test_screened_keeps_the_float32_top_k(m, k, peaked):
    lm = _head(vocab=8000, hidden=128)  # 125 blocks; the last one padding-free, 8000 = 125 * 64
    lm2 = _head(vocab=1000)  # 16 blocks (< k = 50: the token-level start), the last block padding
    with torch.no_grad():
        for head in (lm, lm2):
            tp = TopKProjection(head, k)
            for seed in range(3):
                x = _states(head, m, seed, peaked)
                got = tp.screened(x)
                if isinstance(got, SparseLogits):
                    _assert_holds_top_k(got, x, head, k)
                    assert len(got.rows) < 0.25 * head.out_features * m
                else:  # flat enough that the float32 projection was cheaper
                    assert torch.equal(got, head(x))


@NEEDS_BF16
def test_peaked_rows_keep_few_more_than_k():
    lm = _head(vocab=8192, hidden=128)
    with torch.no_grad():
        got = TopKProjection(lm, 50).screened(_states(lm, 16, 4))
    assert isinstance(got, SparseLogits) and len(got.rows) / 16 < 150  # the screen does screen


@NEEDS_BF16
def test_ties_at_the_kth_logit_are_all_kept():
    lm = _head(vocab=500)
    with torch.no_grad():
        w = lm.weight
        for t in (10, 11, 12, 300, 301):  # five tokens with one logit, well inside the top 3 of x
            w[t] = w[9]
        x = 3 * w[9][None] / w[9].norm() ** 2 * 40
        z = lm(x)
        kth = torch.topk(z[0], 3).values[-1]
        assert int((z[0] >= kth).sum()) >= 6  # the tie reaches past k
        got = TopKProjection(lm, 3).screened(x)
        _assert_holds_top_k(got, x, lm, 3)


@NEEDS_BF16
def test_non_finite_states_and_k_over_the_vocabulary_take_the_float32_path():
    lm = _head(vocab=300)
    with torch.no_grad():
        x = _states(lm, 3, 0)
        x[1, 0] = float("nan")
        got = TopKProjection(lm, 5).screened(x)
        assert isinstance(got, torch.Tensor) and torch.equal(got.isnan(), lm(x).isnan())
        assert not TopKProjection(lm, 300).screens and not TopKProjection(lm, 400).screens
        assert isinstance(TopKProjection(lm, 400)(x[:1]), torch.Tensor)


@pytest.mark.parametrize("opts", [SamplingOptions(top_k=50), SamplingOptions(top_k=20, top_p=0.9),
                                  SamplingOptions(top_k=7, top_p=0.5, temperature=0.7),
                                  SamplingOptions(top_k=0, top_p=0.8, temperature=1.3),
                                  SamplingOptions(top_k=5, temperature=0.5, repetition_penalty=1.2)])
def test_sampling_reads_sparse_logits_as_their_dense_tensor(opts):
    g = torch.Generator().manual_seed(3)
    for trial in range(20):
        m, V = 3, int(torch.randint(60, 2000, (1,), generator=g))
        x = torch.randn(m, V, generator=g) * (1 + trial % 4)
        x[torch.rand(m, V, generator=g) < 0.5] = float("-inf")  # the unlisted entries
        if trial % 4 == 0:  # ties: at the k-th score, and across the kept ones (top-p's order)
            x[0, torch.isfinite(x[0])] = torch.round(x[0, torch.isfinite(x[0])])
        rows, toks = torch.nonzero(torch.isfinite(x), as_tuple=True)
        s = SparseLogits(rows.numpy(), toks.numpy(), x[rows, toks].numpy(), (m, V))
        assert torch.equal(s.dense(), x)
        ctx = [np.arange(5)] * m
        want = opts.probs(x, ctx)
        got = opts.probs(s, ctx)
        assert np.array_equal(got > 0, want > 0)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


def test_top_k_reads():
    assert SamplingOptions(top_k=50).top_k_reads() == 50
    assert SamplingOptions(top_k=0).top_k_reads() is None
    assert SamplingOptions(top_k=50, repetition_penalty=1.1).top_k_reads() is None


@NEEDS_BF16
@pytest.mark.parametrize("opts", [SamplingOptions(temperature=1.0, top_k=20, seed=3),
                                  SamplingOptions(temperature=0.7, top_k=40, top_p=0.9, seed=4)])
def test_seeded_sampling_through_the_screen_emits_what_it_emits_without(opts, monkeypatch):
    """The same seeds, the verifier's projection screened (forced on) or not (forced off): the
    same tokens, and the screen did run."""
    base = tiny_model("llama", torch.float32, seed=2, vocab=600)
    model = BlockwiseModel.from_base(base, 3, seed=0).eval()
    ps = prompts(3, seed=6, vocab=600)
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), nbest=2)
    calls = []
    real = TopKProjection.screened
    monkeypatch.setattr(TopKProjection, "calibrate", lambda self, *a, **k: None)
    monkeypatch.setattr(TopKProjection, "screened", lambda self, h: calls.append(len(h)) or real(self, h))

    def run(screen: bool):
        monkeypatch.setattr(TopKProjection, "use_screen", lambda self, h: screen and self.screens)
        r = bpd_decode(model, ps, d, request=Request(max_new_tokens=24, sampling=opts, verify="tree"))
        return [q.tokens.tolist() for q in r.sequences]

    plain = run(False)
    assert not calls
    assert run(True) == plain
    assert len(calls) > 10


@NEEDS_BF16
def test_calibrate_times_the_float32_path_with_its_top_k(monkeypatch):
    lm = _head(vocab=8192, hidden=128)
    tp = TopKProjection(lm, 50)
    timed = []
    monkeypatch.setattr(tp, "timed_full", lambda h: timed.append(len(h)) or lm(h).topk(50))
    with torch.no_grad():
        tp.calibrate(_states(lm, 8, 0), rows=(2, 8), repeats=1)
    assert sorted(set(timed)) == [2, 8]


def test_one_projection_per_module_and_k():
    lm = _head(vocab=100)
    a = st.topk_projection(lm, 5)
    assert st.topk_projection(lm, 5) is a and st.topk_projection(lm, 6) is not a
    assert sa.argmax_projection(lm) is not a


def test_the_argmax_and_top_k_screens_of_a_module_share_one_bfloat16_copy():
    """One ``ScreenTables`` per output projection module: a second screen makes no second copy,
    and new weights make new tables."""
    lin = torch.nn.Linear(16, 300, bias=False)
    first = sa.argmax_projection(lin)
    if not first.screens:
        pytest.skip("this CPU's bfloat16 products do not accumulate in float32: nothing is screened")
    for other in (st.topk_projection(lin, 5), st.topk_projection(lin, 7)):
        assert other.weight16 is first.weight16 and other.order is first.order
    with torch.no_grad():
        lin.weight.mul_(2.0)
    assert st.topk_projection(lin, 5).weight16 is not first.weight16
