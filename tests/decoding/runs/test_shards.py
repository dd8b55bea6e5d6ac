"""Shard assignment and the launcher's environment (issue 13)."""

import pytest

from latticedraft.decoding.runs.shards import World, device_for, shard_of, world_from_env
from latticedraft.errors import InputError


def test_shard_of_is_a_function_of_the_id_only():
    ids = list(range(1, 201)) + [f"q{i}" for i in range(50)]
    a = [shard_of(i, 2) for i in ids]
    assert a == [shard_of(i, 2) for i in ids] and set(a) == {0, 1}
    assert 80 <= a.count(0) <= 170  # roughly balanced
    assert shard_of(3, 2) is not None and shard_of(3, 1) == 0
    assert [shard_of(i, 3) for i in ids].count(2) > 0


def test_world_from_env():
    assert world_from_env({}) == World(0, 1, 0) and not world_from_env({}).distributed
    w = world_from_env({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    assert w.distributed and (w.rank, w.size) == (1, 2) and device_for(w, "cuda") == "cuda:1"
    assert device_for(w, "cpu") == "cpu" and device_for(World(), "cuda") == "cuda"
    for env in ({"WORLD_SIZE": "2", "RANK": "2"}, {"WORLD_SIZE": "x"}):
        with pytest.raises(InputError, match="torchrun"):
            world_from_env(env)
