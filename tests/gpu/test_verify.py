"""Tree and batched verification against full forwards and ``model.generate`` on tiny
random GPT-2, LLaMA and Mistral (sliding window 7) models."""

import numpy as np
import pytest
import torch

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.verify import Verifier, choose_mode, sliding_window
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
    state, heads = v.prefill(ps)
    out = [[int(heads[i, 0].argmax())] for i in range(4)]
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
        # the heads' logits at the last accepted node equal a full forward's last logits
        for i in range(4):
            full = torch.as_tensor(np.concatenate([ps[i], out[i][:-1]])[None])
            ref_logits = model.base(full).logits[0, -1]
            assert torch.allclose(res.head_logits[i, 0], ref_logits, atol=1e-8)


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
    state, heads = v.prefill([p])
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
    (s1, h1), (s2, h2) = full.prefill(ps), part.prefill(ps)
    assert h1.shape[1] == 5 and h2.shape[1] == 3 and torch.allclose(h1[:, :3], h2, atol=1e-10)
    roots = np.array([r[0] for r in refs])
    drafts = [np.array([r[1:5], r[1:3] + [0, 0]]) for r in refs]
    a, b = full.verify(s1, roots, drafts), part.verify(s2, roots, drafts)
    assert [x.tolist() for x in a.accepted] == [x.tolist() for x in b.accepted] == [r[1:5] for r in refs]
    assert a.bonus.tolist() == b.bonus.tolist() == [r[5] for r in refs]
    assert torch.allclose(a.head_logits[:, :3], b.head_logits, atol=1e-10)
    # the lazily projected heads equal the model's own full forward at the last accepted token
    for i, (p, r) in enumerate(zip(ps, refs)):
        want = model(torch.as_tensor(np.concatenate([p, r[:5]])[None])).head_logits[0, -1]
        assert torch.allclose(a.head_logits[i], want, atol=1e-8)
