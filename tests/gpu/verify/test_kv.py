"""``KVCache``: in-place writes, commits that move nothing for the written prefix and only the
accepted nodes otherwise, growth, row selection, slots pending across forwards, left alignment,
transformers' ``update`` protocol, and the cache shown as transformers' ``DynamicCache``."""

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from latticedraft.errors import InputError
from latticedraft.gpu.models.hf import cache_arg
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.models.layer_split import LayerSplit
from tests.decoding.tiny import tiny_model


def _fill(c: KVCache, n: int, base: float) -> None:
    """Reserve n slots and write, in every layer l, keys base + 10 l + slot (values their negatives)."""
    start = c.reserve(n)
    for layer in range(c.layers):
        k = (base + 10 * layer + start + torch.arange(n, dtype=torch.float32)).view(1, 1, n, 1).expand(c.batch, 1, n, 1)
        c.write(layer, k.contiguous(), -k.contiguous())


def test_prefix_commit_moves_nothing_and_other_paths_gather_the_accepted_nodes():
    c = KVCache(2, layers=2)
    _fill(c, 3, 0.0)
    c.append_valid(torch.ones(2, 3, dtype=torch.bool), torch.arange(3).expand(2, 3))
    _fill(c, 4, 100.0)  # a tree of 4 nodes after slot 3
    before = c.store.clone()
    c.commit(3, torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2, dtype=torch.bool))  # the written prefix
    assert torch.equal(c.store, before) and c.length == 5 and c.next_pos.tolist() == [5, 5]
    _fill(c, 4, 200.0)  # nodes at slots 5..8
    c.commit(5, torch.tensor([[0, 2, 3], [0, 1, 0]]), torch.tensor([[True, True, True], [True, False, False]]))
    keys = c.store[:, 0, :, 0, :, 0]  # [layers, rows, slots]
    for layer in range(2):
        assert keys[layer, 0, 5:8].tolist() == [200.0 + 10 * layer + s for s in (5, 7, 8)]
        assert keys[layer, 1, 5].item() == 200.0 + 10 * layer + 5
    assert c.store[1, 1, 0, 0, 6, 0].item() == -(200.0 + 10 + 7)  # values move with their keys
    assert c.valid.tolist() == [[True] * 8, [True] * 6 + [False] * 2]
    assert c.pos.tolist() == [list(range(8)), list(range(6)) + [-1, -1]] and c.next_pos.tolist() == [8, 6]


def test_growth_keeps_what_is_held_and_rows_leave():
    c = KVCache(3, layers=1, capacity=2)
    _fill(c, 2, 0.0)
    c.append_valid(torch.ones(3, 2, dtype=torch.bool), torch.arange(2).expand(3, 2))
    _fill(c, 5, 50.0)  # past the capacity: the store doubles (at least), the first slots stay
    assert c.capacity >= 7 and c.store[0, 0, :, 0, :2, 0].tolist() == [[0.0, 1.0]] * 3
    c.commit(2, torch.tensor([[0]] * 3), torch.ones(3, 1, dtype=torch.bool))
    c.select_rows(torch.tensor([2, 0]))
    assert c.batch == 2 and c.store.shape[2] == 2 and c.next_pos.tolist() == [3, 3]


def test_transformers_layers_write_through_update_as_into_a_dynamic_cache():
    model = tiny_model("llama", torch.float64, layers=2)
    split = LayerSplit(model)
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(6)[None].expand(2, 6)
    bias = split.bias(torch.zeros(2, 0, dtype=torch.bool), pos[:, :0], pos, torch.ones(2, 6, 6, dtype=torch.bool).tril())
    kv, dynamic = KVCache(2, layers=2), DynamicCache()
    kv.reserve(6)
    a = split.run(split.embed(ids, pos), 0, 2, bias, pos, kv)
    b = split.run(split.embed(ids, pos), 0, 2, bias, pos, dynamic)
    assert torch.equal(a, b)
    assert torch.equal(kv.store[1, 0, :, :, :6], dynamic.layers[1].keys)


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_as_a_dynamic_cache_the_model_builds_its_masks_and_writes_in_place(kind):
    """Two forwards of a model that builds its own masks, left-padded rows included: the same
    logits as over transformers' own DynamicCache, and the keys land in the store (no copy)."""
    model = tiny_model(kind, torch.float64, layers=2)
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0  # row 1 left-padded by 2
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    kv, dynamic = KVCache(2, layers=2, capacity=2), DynamicCache()
    kv.reserve(5)
    a = model(input_ids=ids, attention_mask=mask, position_ids=pos, **cache_arg(kv.transformers_cache())).logits
    b = model(input_ids=ids, attention_mask=mask, position_ids=pos, **cache_arg(dynamic)).logits
    assert torch.allclose(a, b, atol=1e-12)
    kv.append_valid(mask.bool(), pos)
    nxt = torch.tensor([[7, 8], [9, 10]])
    mask2 = torch.cat([mask, torch.ones(2, 2, dtype=torch.long)], 1)
    pos2 = torch.from_numpy(kv.next_pos[:, None] + np.arange(2))
    kv.reserve(2)
    view = kv.transformers_cache()
    assert view.get_seq_length() == 5 and kv.store.data_ptr() == view.layers[0].keys.data_ptr()
    a = model(input_ids=nxt, attention_mask=mask2, position_ids=pos2, **cache_arg(view)).logits
    b = model(input_ids=nxt, attention_mask=mask2, position_ids=pos2, **cache_arg(dynamic)).logits
    assert torch.allclose(a, b, atol=1e-12)
    assert torch.equal(kv.store[1, 0, :, :, :7], dynamic.layers[1].keys)


def test_transformers_cache_refuses_a_rolling_buffer_or_a_layer_range():
    for cache in (KVCache(1, layers=2, window=4), KVCache(1, layers=2, first_layer=1)):
        with pytest.raises(InputError, match="every layer without a rolling buffer"):
            cache.transformers_cache()


def test_left_align_moves_holes_first_with_their_keys():
    c = KVCache(2, layers=2)
    _fill(c, 5, 0.0)
    valid = np.ones((2, 5), dtype=bool)
    valid[1, :2] = False  # row 1 left-padded by 2
    c.append_valid(valid, np.maximum(np.cumsum(valid, 1) - 1, 0))
    _fill(c, 2, 100.0)
    c.commit_prefix(5, np.array([2, 1]))  # row 1 keeps one of two: a hole at slot 6
    held = c.store[:, :, 1, :, [2, 3, 4, 5], :].clone()
    c.left_align()
    assert c.valid[1].tolist() == [False] * 3 + [True] * 4 and c.valid[0].all()
    assert c.pos[1, 3:].tolist() == [0, 1, 2, 3] and c.pos[0].tolist() == list(range(7))
    assert torch.equal(c.store[:, :, 1, :, 3:7, :], held)
    before = c.store.clone()
    c.left_align()  # aligned already: nothing moves
    assert torch.equal(c.store, before)


def test_repeated_rows_are_copies_and_forks_leave_the_original():
    c = KVCache(2, layers=1)
    _fill(c, 3, 0.0)
    c.append_valid(np.ones((2, 3), dtype=bool), np.arange(3)[None].repeat(2, 0))
    c.store[:, :, 1] += 1000.0
    fork = c.fork(np.array([1, 1, 0]))
    assert fork.batch == 3 and c.batch == 2
    assert torch.equal(fork.store[:, :, 0], c.store[:, :, 1]) and torch.equal(fork.store[:, :, 2], c.store[:, :, 0])
    fork.store[:, :, 0] = 0.0
    assert c.store[0, 0, 1, 0, 0, 0].item() == 1000.0


@torch.inference_mode()
def test_pending_forwards_before_one_commit_equal_the_full_forward():
    """Kangaroo's drafting: token by token into a cache grown while slots are pending (capacity 4),
    a row's later drafts masked (mark), then commit_prefix keeps each row's first counts[i]."""
    model = tiny_model("llama", torch.float64, layers=2)
    split = LayerSplit(model)
    ids = torch.randint(1, 64, (2, 3), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(3)[None].expand(2, 3)
    kv = KVCache(2, layers=2, capacity=4)
    bias = split.bias(*kv.keys(), pos.numpy(), np.tri(3, dtype=bool)[None].repeat(2, 0))
    kv.reserve(3)
    split.run(split.embed(ids, pos), 0, 2, bias, pos, kv)
    kv.append_valid(np.ones((2, 3), dtype=bool), pos)
    start, drafts = kv.end, torch.tensor([[7, 8, 9], [10, 11, 12]])
    for j in range(3):
        q = kv.next_pos[:, None] + j
        bias = split.bias(*kv.keys(), q, np.ones((2, 1, 1), dtype=bool))
        kv.reserve(1)
        split.run(split.embed(drafts[:, j:j + 1], torch.from_numpy(q)), 0, 2, bias, torch.from_numpy(q), kv)
        kv.mark(np.array([[True], [j == 0]]), q)  # row 1 stops drafting after its first token
    assert kv.keys()[0].tolist() == [[True] * 6, [True] * 4 + [False] * 2] and kv.capacity >= 6
    kv.commit_prefix(start, np.array([3, 1]))
    assert kv.length == 6 and kv.next_pos.tolist() == [6, 4]
    q = kv.next_pos[:, None]
    bias = split.bias(*kv.keys(), q, np.ones((2, 1, 1), dtype=bool))
    kv.reserve(1)
    h = split.run(split.embed(torch.tensor([[5], [6]]), torch.from_numpy(q)), 0, 2, bias, torch.from_numpy(q), kv)
    for i, kept in enumerate((3, 1)):
        seq = torch.cat([ids[i], drafts[i, :kept], torch.tensor([5 + i])])[None]
        ref = model(seq, output_hidden_states=True).hidden_states[-1][0, -1]
        assert torch.allclose(split.norm(h[i, 0]), ref, atol=1e-9)
