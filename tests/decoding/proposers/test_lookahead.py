"""Lookahead decoding: the Figure 2(b) mask written out by hand, the window and pool, and
exactness against ``model.generate(do_sample=False)`` on tiny random GPT-2 / LLaMA / Mistral
(float32 and float64), batch 1 and 4 with prompts of different lengths, over a (W, N, G) grid
that includes W = 1, N = 2, G = 0 and G larger than the pool; the batched fallback; EOS."""

import functools

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.lookahead import LookaheadOptions, lookahead_decode
from latticedraft.decoding.proposers.lookahead import start_row
from latticedraft.decoding.proposers.lookahead_pool import JacobiWindow, NgramPool
from latticedraft.errors import InputError
from latticedraft.gpu.verify.side_branch import step_layout
from latticedraft.gpu.verify.tree import build_tree
from tests.decoding.tiny import prompts, reference, tiny_model

MAX_NEW = 24
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Figure 2(b), W = 5, N = 4, G = 2: root | orange (level 0) cols 0-4 | green (level 1) | red
# (level 2) | candidate A (3 tokens) | candidate B (3 tokens). Row = query, column = key.
FIGURE_2B = """
0000000000111111111122
0123456789012345678901
1000000000000000000000  0  root
1100000000000000000000  1  orange 1
1110000000000000000000  2  orange 2
1111000000000000000000  3  orange 3
1111100000000000000000  4  orange 4
1111110000000000000000  5  orange 5
1100001000000000000000  6  green 2
1110000100000000000000  7  green 3
1111000010000000000000  8  green 4
1111100001000000000000  9  green 5
1111110000100000000000 10  green 6
1100001000010000000000 11  red 3
1110000100001000000000 12  red 4
1111000010000100000000 13  red 5
1111100001000010000000 14  red 6: orange 1-4, green 5, itself
1111110000100001000000 15  red 7
1000000000000000100000 16  A1
1000000000000000110000 17  A2
1000000000000000111000 18  A3
1000000000000000000100 19  B1
1000000000000000000110 20  B2
1000000000000000000111 21  B3
"""


def _hand_mask() -> np.ndarray:
    rows = [ln.split()[0] for ln in FIGURE_2B.strip().splitlines()[2:]]
    return np.array([[c == "1" for c in r] for r in rows])


def test_figure_2b_mask_entry_by_entry():
    window = JacobiWindow(5, 4, np.arange(10, 15))
    window.update(np.arange(20, 25))
    window.update(np.arange(30, 35))  # three levels: the window is full
    assert window.full
    tree = build_tree(1, np.array([[40, 41, 42], [50, 51, 52]]))
    lay = step_layout(tree, window.side())
    expected = _hand_mask()
    assert lay.ancestors.shape == expected.shape == (22, 22)
    for q in range(22):
        for k in range(22):
            assert lay.ancestors[q, k] == expected[q, k], (q, k)
    assert lay.depth.tolist() == [0, 1, 2, 3, 4, 5, 2, 3, 4, 5, 6, 3, 4, 5, 6, 7, 1, 2, 3, 1, 2, 3]
    assert lay.tokens.tolist() == [1, *range(10, 15), *range(20, 25), *range(30, 35), 40, 41, 42, 50, 51, 52]
    assert lay.tree_index.tolist() == [0, 16, 17, 18, 19, 20, 21]
    assert window.side().wanted.tolist() == [10, 11, 12, 13, 14]


def test_window_warms_up_then_yields_diagonal_ngrams():
    w = JacobiWindow(3, 4, np.array([1, 2, 3]))
    assert w.update(np.array([4, 5, 6])).shape == (0, 4)
    assert w.update(np.array([7, 8, 9])).shape == (0, 4)
    grams = w.update(np.array([10, 11, 12]))
    assert grams.tolist() == [[1, 4, 7, 10], [2, 5, 8, 11], [3, 6, 9, 12]]
    assert [lv.tolist() for lv in w.levels] == [[4, 5, 6], [7, 8, 9], [10, 11, 12]]
    w2 = JacobiWindow(1, 2, np.array([5]))  # N = 2: full at once, 2-grams
    assert w2.update(np.array([6])).tolist() == [[5, 6]] and w2.levels[0].tolist() == [6]


def test_pool_lru_per_key_and_zero():
    pool = NgramPool(2)
    for g in ([1, 2, 3], [1, 4, 5], [7, 8, 9], [1, 2, 3], [1, 6, 6]):
        pool.add(np.array(g))
    assert [c.tolist() for c in pool.get(1)] == [[6, 6], [2, 3]]  # [4, 5] was least recent
    assert [c.tolist() for c in pool.get(7)] == [[8, 9]] and pool.get(3) == [] and len(pool) == 3
    empty = NgramPool(0)
    empty.seed(np.array([1, 2, 3, 1, 2]), 3)
    assert len(empty) == 0 and empty.get(1) == []
    with pytest.raises(InputError):
        NgramPool(-1)
    with pytest.raises(InputError):
        LookaheadOptions(W=0)


@functools.lru_cache(maxsize=None)
def _case(arch, dtype, batch, seed=0):
    model = tiny_model(arch, dtype, seed=seed)
    ps = prompts(batch, seed=seed + 10, lengths=(5, 12, 3, 9))
    return model, ps, [reference(model, p, MAX_NEW) for p in ps]


GRID = [(1, 2, 0), (1, 2, 1), (3, 3, 2), (5, 4, 2), (15, 5, 15), (4, 3, 64)]


@pytest.mark.parametrize("W,N,G", GRID)
@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 4])
def test_lookahead_equals_generate(W, N, G, arch, dtype, batch):
    model, ps, refs = _case(arch, dtype, batch)
    r = lookahead_decode(model, ps, W=W, N=N, G=G, max_new_tokens=MAX_NEW)
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert r.verify_mode == "tree"
    for s in r.sequences:
        assert sum(s.tokens_per_call) == len(s.tokens) == MAX_NEW
        assert s.calls == 1 + len(s.accepted_drafts) == 1 + len(s.tree_nodes)
        assert all(1 <= n <= N for n in s.tokens_per_call)
        if G == 0:
            assert s.calls == MAX_NEW  # nothing to verify: one token per call


def test_pool_candidates_are_accepted():
    """Tiny random models loop; the pool catches the loop and steps emit several tokens, so
    the accept-and-commit path of the verification branch is exercised (and still exact)."""
    model, ps, refs = _case("llama", torch.float64, 4)
    r = lookahead_decode(model, ps, W=5, N=4, G=5, max_new_tokens=MAX_NEW, prompt_as_reference=True)
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert max(max(s.tokens_per_call) for s in r.sequences) >= 3
    assert r.block_efficiency > 1.2


@pytest.mark.parametrize("arch", ["mistral", "gpt2"])
def test_batched_fallback_is_exact(arch):
    model, ps, refs = _case(arch, torch.float32, 4)
    r = lookahead_decode(model, ps, W=4, N=3, G=3, max_new_tokens=MAX_NEW, verify="batched")
    assert r.verify_mode == "batched"
    assert [s.tokens.tolist() for s in r.sequences] == refs


def test_rows_stop_on_their_own_eos_and_stream():
    model, ps, free = _case("gpt2", torch.float64, 4)
    eos = free[1][5]
    refs = [reference(model, p, MAX_NEW, eos=eos) for p in ps]
    streamed = {i: [] for i in range(4)}
    r = lookahead_decode(model, ps, W=4, N=3, G=4, max_new_tokens=MAX_NEW, eos_token_id=eos,
                         on_tokens=lambda i, t: streamed[i].extend(t))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert [streamed[i] for i in range(4)] == refs


def test_prompt_as_reference_seeds_the_pool_and_repeats():
    model, ps, refs = _case("gpt2", torch.float32, 1)
    a = lookahead_decode(model, ps, W=3, N=3, G=3, max_new_tokens=MAX_NEW, prompt_as_reference=True)
    b = lookahead_decode(model, ps, W=3, N=3, G=3, max_new_tokens=MAX_NEW, prompt_as_reference=True)
    assert a.sequences[0].tokens.tolist() == refs[0]
    assert a.sequences[0].tokens_per_call == b.sequences[0].tokens_per_call
    window, pool = start_row(LookaheadOptions(W=3, N=3, G=3, prompt_as_reference=True), np.array([4, 5, 6, 4, 5, 7]), 64, 0)
    assert [c.tolist() for c in pool.get(4)] == [[5, 7], [5, 6]]
    assert set(window.levels[0].tolist()) <= {4, 5, 6, 7}


# -- the pool as a lattice source: lookahead's window and pool inside the BPD loop -------------

def _cost(slope):
    from latticedraft.gpu.verify.cost_model import CostModel

    n = np.arange(1, 65)
    return CostModel(tuple(n.tolist()), tuple((1.0 + slope * (n - 1)).tolist()))


@functools.lru_cache(maxsize=None)
def _bpd_case(arch, batch):
    from tests.decoding.tiny import blockwise

    model = blockwise(arch, torch.float32, num_heads=4)
    ps = prompts(batch, seed=3, lengths=(5, 12, 3, 9))
    return model, ps, [reference(model, p, MAX_NEW) for p in ps]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("drafter,tree,context,verify", [
    ("top1", "fixed", None, "auto"), ("parallel-base", "auto", 3, "auto"), (None, "fixed", None, "auto"),
    ("top1", "auto", 2, "batched"),
])
def test_bpd_with_the_lookahead_pool_equals_generate(arch, batch, drafter, tree, context, verify):
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter

    model, ps, refs = _bpd_case(arch, batch)
    d = None if drafter is None else make_drafter(drafter, options=LatticeOptions(k=4), nbest=4)
    r = bpd_decode(
        model,
        ps,
        d,
        BpdPlan(
            tree=tree,
            cost=_cost(0.05) if tree == "auto" else None,
            sources=(ContextProposer(ContextNgrams(max_ngram=context)),) if context else (),
            lookahead=LookaheadOptions(W=4, N=3, G=4),
        ),
        Request(max_new_tokens=MAX_NEW, verify=verify),
    )
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert r.verify_mode == ("batched" if verify == "batched" else "tree")


def test_bpd_without_heads_plus_pool_is_lookahead_decoding():
    """With no head drafts and a fixed tree, the BPD tree holds exactly the pool's paths, so the
    loop makes lookahead_decode's steps: the pool's n-grams reach the tree and get accepted."""
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.registry import Request

    model, ps, refs = _bpd_case("llama", 4)
    opts = LookaheadOptions(W=5, N=4, G=5, prompt_as_reference=True)
    via_bpd = bpd_decode(model, ps, None, BpdPlan(tree="fixed", lookahead=opts), Request(max_new_tokens=MAX_NEW))
    direct = lookahead_decode(model, ps, W=5, N=4, G=5, prompt_as_reference=True, max_new_tokens=MAX_NEW)
    assert [s.tokens.tolist() for s in via_bpd.sequences] == refs
    assert [s.tokens_per_call for s in via_bpd.sequences] == [s.tokens_per_call for s in direct.sequences]
    assert via_bpd.block_efficiency > 1.2


def test_a_step_beyond_the_positions_or_the_memory_is_refused_before_decoding(monkeypatch):
    import latticedraft.memory as memory
    from latticedraft.decoding.methods.lookahead import check_step_size

    model = tiny_model("llama")
    limit = model.config.max_position_embeddings
    with pytest.raises(InputError, match=f"--window {limit + 1} must be <= {limit}"):
        lookahead_decode(model, prompts(1), W=limit + 1, max_new_tokens=4)
    with pytest.raises(InputError, match=f"--ngram {limit + 1} must be <= {limit}"):
        check_step_size(model, LookaheadOptions(W=4, N=limit + 1, G=4))
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 10_000_000)
    check_step_size(model, LookaheadOptions(W=15, N=5, G=15))  # the default fits in 10 MB
    with pytest.raises(
        InputError,
        match=r"--window 200 \(with --ngram 60, --pool 15\) would need about .* the "
        r"largest --window that fits is \d+",
    ):
        check_step_size(model, LookaheadOptions(W=200, N=60, G=15))
