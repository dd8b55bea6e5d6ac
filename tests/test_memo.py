"""Memos live on their object and are left out of its copies and pickles."""

import copy
import pickle

from latticedraft.memo import memo_of
from tests.decoding.tiny import tiny_model


def test_a_memo_is_kept_on_its_object_and_left_out_of_copies():
    m = tiny_model("gpt2")
    memo_of(m, "sessions")[("k",)] = 1
    assert memo_of(m, "sessions") == {("k",): 1} and m._latticedraft_sessions is memo_of(m, "sessions")
    assert memo_of(m, "verifiers") == {}
    c = copy.deepcopy(m)
    assert memo_of(c, "sessions") == {} and len(memo_of(m, "sessions")) == 1
    assert memo_of(pickle.loads(pickle.dumps(m)), "sessions") == {}
