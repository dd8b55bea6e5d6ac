"""``KVCache``: in-place writes, commits that move nothing for the written prefix and only the
accepted nodes otherwise, growth, row selection, and transformers' ``update`` protocol."""

import torch

from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.verify.layer_split import LayerSplit
from latticedraft.gpu.verify.kvcache import SlotCache
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
    kv, slot = KVCache(2, layers=2), SlotCache.empty(2)
    kv.reserve(6)
    a = split.run(split.embed(ids, pos), 0, 2, bias, pos, kv)
    b = split.run(split.embed(ids, pos), 0, 2, bias, pos, slot.cache)
    assert torch.equal(a, b)
    assert torch.equal(kv.store[1, 0, :, :, :6], slot.cache.layers[1].keys)
