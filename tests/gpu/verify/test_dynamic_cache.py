import torch

from latticedraft.gpu.verify.dynamic_cache import SlotCache, cache_length, crop_to


def _filled(b=2, L=5, heads=2, d=3):
    s = SlotCache.empty(b)
    k = torch.arange(b * heads * L * d, dtype=torch.float32).view(b, heads, L, d)
    s.cache.update(k, -k, 0)
    valid = torch.ones(b, L, dtype=torch.bool)
    valid[1, :2] = False  # row 1 is left-padded by 2
    pos = (torch.cumsum(valid.long(), 1) - 1).clamp(min=0)
    s.append_valid(valid, pos)
    return s, k


def test_append_valid_positions():
    s, _ = _filled()
    assert s.next_pos.tolist() == [5, 3]
    assert s.pos[1].tolist() == [-1, -1, 0, 1, 2]


def test_commit_keeps_selected_new_slots():
    s, k = _filled(L=5)
    new = torch.randn(2, 2, 4, 3)
    s.cache.update(new, -new, 0)  # a forward appended 4 nodes
    keep = torch.tensor([[0, 2, 3], [0, 1, 0]])
    ok = torch.tensor([[True, True, True], [True, True, False]])
    s.commit(5, keep, ok)
    layer = s.cache.layers[0]
    assert layer.keys.shape[2] == 8 and s.length == 8
    assert torch.equal(layer.keys[0, :, 5:], new[0, :, [0, 2, 3]])
    assert torch.equal(layer.values[1, :, 5:7], -new[1, :, [0, 1]])
    assert s.valid[1].tolist() == [False, False, True, True, True, True, True, False]
    assert s.pos[0, 5:].tolist() == [5, 6, 7] and s.pos[1, 5:].tolist() == [3, 4, -1]
    assert s.next_pos.tolist() == [8, 5]


def test_left_align_moves_holes_first():
    s, _ = _filled(L=5)
    new = torch.randn(2, 2, 2, 3)
    s.cache.update(new, new, 0)
    s.commit(5, torch.tensor([[0, 1], [0, 0]]), torch.tensor([[True, True], [True, False]]))
    before = s.cache.layers[0].keys[1, :, s.valid[1]].clone()
    s.left_align()
    assert s.valid[1].tolist() == [False] * 3 + [True] * 4
    assert torch.equal(s.cache.layers[0].keys[1, :, 3:], before)
    assert s.pos[1, 3:].tolist() == [0, 1, 2, 3]


def test_select_and_repeat_rows():
    s, k = _filled()
    s.repeat_rows(3)
    assert s.batch == 6 and torch.equal(s.cache.layers[0].keys[4], k[1])
    s.select_rows(torch.tensor([4]))
    assert s.next_pos.tolist() == [3] and torch.equal(s.cache.layers[0].keys[0], k[1])


def test_crop_to():
    s, _ = _filled()
    crop_to(s.cache, 2)
    assert cache_length(s.cache) == 2


def test_commit_of_a_leading_run_is_a_view_with_the_same_result():
    s, _ = _filled(L=5)
    new = torch.randn(2, 2, 4, 3)
    s.cache.update(new, -new, 0)
    s.commit(5, torch.tensor([[0, 1], [0, 1]]), torch.ones(2, 2, dtype=torch.bool))
    layer = s.cache.layers[0]
    assert layer.keys.shape[2] == 7 and torch.equal(layer.keys[:, :, 5:], new[:, :, :2])
    assert s.pos[:, 5:].tolist() == [[5, 6], [3, 4]] and s.next_pos.tolist() == [7, 5]
