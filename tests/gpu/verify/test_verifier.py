"""Tree and batched verification against full forwards and ``model.generate`` on tiny
random GPT-2, LLaMA and Mistral (sliding window 7) models."""

import numpy as np
import pytest
import torch

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.verify.verifier import UNEMBED_ROWS, Verifier
from latticedraft.gpu.verify.modes import choose_mode, sliding_window
from tests.decoding.tiny import ToyHeads, prompts, reference, tiny_model

ARCHS = ["gpt2", "llama", "mistral"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _drafts_with_errors(rng, cont, at, p, d, vocab):
    """p drafts of length d; draft 0 follows ``cont`` for ``at`` tokens then goes wrong."""
    rows = rng.integers(0, vocab, size=(p, d))
    good = cont[:d]
    rows[0, : len(good)] = good
    if at < d and at < len(cont):
        rows[0, at] = (cont[at] + 1) % vocab
    rows[1, :] = rows[0, :]  # a duplicate shares the whole path
    if d > 1:
        rows[2, 0] = rows[0, 0]  # a sibling branch after one shared token
    return rows


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["tree", "batched"])
def test_accepts_exactly_the_greedy_prefix(arch, mode):
    torch.manual_seed(0)
    model = ToyHeads(tiny_model(arch, torch.float64), num_heads=2)
    ps = prompts(4, seed=3)
    refs = [reference(model, p, 28) for p in ps]
    v = Verifier(model, mode)
    assert v.mode == mode
    state, first, heads = v.prefill(ps)
    out = [[int(first[i])] for i in range(4)]
    assert [o[0] for o in out] == [r[0] for r in refs]
    rng = np.random.default_rng(0)
    for step in range(4):
        drafts, want = [], []
        for i in range(4):
            cont = np.asarray(refs[i][len(out[i]):], dtype=np.int64)
            at = int(rng.integers(0, 6))
            drafts.append(_drafts_with_errors(rng, cont, at, p=4, d=5, vocab=64))
            want.append(min(at, 5))
        res = v.verify(state, np.array([o[-1] for o in out]), drafts)
        for i in range(4):
            acc = res.accepted[i].tolist()
            assert len(acc) >= want[i]  # random drafts may get lucky, never unlucky
            out[i] += acc + [int(res.bonus[i])]
            assert out[i] == refs[i][: len(out[i])]
        # the extra heads' logits at the last accepted node equal a full forward's last ones
        for i in range(4):
            full = torch.as_tensor(np.concatenate([ps[i], out[i][:-1]])[None])
            ref_logits = model(full).head_logits[0, -1, 1:]
            assert torch.allclose(res.head_logits[i], ref_logits, atol=1e-8)


def test_sliding_window_is_read_from_the_config():
    assert sliding_window(tiny_model("mistral")) == 7
    assert sliding_window(tiny_model("llama")) is None


def test_mode_choice_is_reported():
    m = tiny_model("llama")
    assert choose_mode(m)[0] == "tree"
    m.config._attn_implementation = "flash_attention_2"
    mode, why = choose_mode(m)
    assert mode == "batched" and "flash_attention_2" in why
    with pytest.raises(ModelError, match="batched"):
        choose_mode(m, "tree")
    with pytest.raises(InputError, match="auto"):
        choose_mode(m, "sideways")
    mixed = tiny_model("mistral")
    mixed.config.layer_types = ["full_attention", "sliding_attention"]
    mode, why = choose_mode(mixed)
    assert mode == "batched" and "mixed layer types" in why


def test_eager_attention_also_takes_the_tree_mask():
    model = ToyHeads(tiny_model("llama", torch.float64, attn="eager"), num_heads=2)
    p = prompts(1)[0]
    ref = reference(model, p, 8)
    v = Verifier(model)
    state, _, heads = v.prefill([p])
    res = v.verify(state, np.array([ref[0]]), [np.array([ref[1:6], [1, 2, 3, 4, 5]])])
    assert res.accepted[0].tolist() == ref[1:6] and int(res.bonus[0]) == ref[6]


def test_empty_prompt_is_an_input_error():
    v = Verifier(tiny_model("gpt2"))
    with pytest.raises(InputError, match="at least one token"):
        v.prefill([np.array([1, 2]), np.array([], dtype=np.int64)])


def test_lazy_verification_computes_only_the_heads_asked_for():
    from tests.decoding.tiny import blockwise

    model = blockwise("gpt2", torch.float64, num_heads=5)
    ps = prompts(2, seed=5)
    refs = [reference(model, p, 12) for p in ps]
    full, part = Verifier(model), Verifier(model, num_heads=3)
    assert full.lazy and part.lazy
    (s1, r1, h1), (s2, r2, h2) = full.prefill(ps), part.prefill(ps)
    assert r1.tolist() == r2.tolist() == [r[0] for r in refs]
    assert h1.shape[1] == 4 and h2.shape[1] == 2 and torch.allclose(h1[:, :2], h2, atol=1e-10)
    roots = np.array([r[0] for r in refs])
    drafts = [np.array([r[1:5], r[1:3] + [0, 0]]) for r in refs]
    a, b = full.verify(s1, roots, drafts), part.verify(s2, roots, drafts)
    assert [x.tolist() for x in a.accepted] == [x.tolist() for x in b.accepted] == [r[1:5] for r in refs]
    assert a.bonus.tolist() == b.bonus.tolist() == [r[5] for r in refs]
    assert torch.allclose(a.head_logits[:, :2], b.head_logits, atol=1e-10)
    # the lazily projected heads equal the model's own full forward at the last accepted token
    for i, (p, r) in enumerate(zip(ps, refs)):
        want = model(torch.as_tensor(np.concatenate([p, r[:5]])[None])).head_logits[0, -1, 1:]
        assert torch.allclose(a.head_logits[i], want, atol=1e-8)


def test_draft_vocabulary_projects_the_heads_onto_its_rows_only():
    from tests.decoding.tiny import blockwise

    model = blockwise("gpt2", torch.float64, num_heads=4)
    ps = prompts(2, seed=6)
    refs = [reference(model, p, 10) for p in ps]
    ids = np.array([3, 9, 1, 40, 41, 63, 9])  # unsorted, with a duplicate: kept once, sorted
    full, small = Verifier(model), Verifier(model, draft_vocab=ids)
    assert small.draft_vocab.ids.tolist() == [1, 3, 9, 40, 41, 63]
    (s1, r1, h1), (s2, r2, h2) = full.prefill(ps), small.prefill(ps)
    assert r1.tolist() == r2.tolist() and h2.shape == (2, 3, 6)
    assert torch.allclose(h2, h1[..., small.draft_vocab.ids], atol=1e-10)
    roots = np.array([r[0] for r in refs])
    drafts = [np.array([r[1:4]]) for r in refs]
    a, b = full.verify(s1, roots, drafts), small.verify(s2, roots, drafts)  # verification is unchanged
    assert [x.tolist() for x in a.accepted] == [x.tolist() for x in b.accepted] and a.bonus.tolist() == b.bonus.tolist()
    assert torch.allclose(b.head_logits, a.head_logits[..., small.draft_vocab.ids], atol=1e-10)
    with pytest.raises(InputError, match="draft vocabulary"):
        Verifier(model, draft_vocab=[0, 64])


def test_one_verifier_per_model_and_settings_sharing_the_projection_cost():
    """for_model keeps one verifier per settings on the model (a new one when the weights change);
    the output projection's cost curve is measured once per model, whichever verifier asks;
    begin starts a decode's tallies."""
    from latticedraft.memo import memo_of
    from tests.decoding.tiny import blockwise

    m = blockwise("gpt2", torch.float32, num_heads=3)
    a = Verifier.for_model(m)
    assert Verifier.for_model(m) is a and Verifier.for_model(m, num_heads=1) is not a
    small, big = a.unembed_seconds(1), a.unembed_seconds(200)
    curve = next(iter(memo_of(m, "verify")["unembed_curves"].values()))
    assert Verifier.for_model(m, num_heads=1).unembed_seconds(1) == small
    assert Verifier(m).unembed_seconds(1) == small
    assert next(iter(memo_of(m, "verify")["unembed_curves"].values())) is curve
    assert big > 0 and len(curve) == len(UNEMBED_ROWS)
    state, roots, _ = a.prefill(prompts(2, seed=1))
    a.verify(state, roots, [np.array([[3, 4]]), np.array([[5]])])
    assert a.peak_cache_bytes > 0 and a.timing["forward"] > 0
    a.begin()
    assert a.peak_cache_bytes == 0 and sum(a.timing.values()) == 0
    with torch.no_grad():
        next(m.parameters()).add_(0.0)  # an in-place update: new weights
    assert Verifier.for_model(m) is not a


def test_heads_come_from_the_accepted_node_when_a_side_branch_rides_along():
    """Side nodes sit between the root and the tree: the heads must be read at the accepted
    node's layout position, equal to a verify of the same drafts without the side branch."""
    from latticedraft.gpu.verify.side_branch import SideBranch
    from tests.decoding.tiny import blockwise

    m = blockwise("llama", torch.float32, num_heads=4)
    p = prompts(1, seed=3)[0]
    ref = reference(m, p, 3)
    side = SideBranch(np.array([5, 6, 7]), np.array([1, 2, 1]), np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]], bool),
                      np.array([1, 2]))
    got = []
    for sides in (None, [side]):
        v = Verifier(m)
        state, first, _ = v.prefill([p])
        res = v.verify(state, first, [np.array([[ref[1], ref[2]]])], sides)
        assert res.accepted[0].tolist() == ref[1:3]
        got.append(res.head_logits)
    assert torch.allclose(got[0], got[1], atol=1e-4)
