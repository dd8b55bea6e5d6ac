"""PPD equals generate(do_sample=False) token for token, for any (dbar, k), batch 1 and 4."""

import pytest

from latticedraft.decoding.ppd.pipeline import ppd_decode
from latticedraft.errors import InputError
from tests.decoding.tiny import prompts, reference, tiny_model


SLOW = pytest.mark.slow


@pytest.mark.parametrize("arch,dbar,k", [
    ("gpt2", 1, 1), ("gpt2", 3, 5), pytest.param("gpt2", 2, 3, marks=SLOW),
    ("llama", 2, 3), ("llama", 1, 1), pytest.param("llama", 3, 5, marks=SLOW),
    ("mistral", 3, 5), ("mistral", 2, 3), pytest.param("mistral", 1, 1, marks=SLOW),
])
def test_ppd_equals_generate(arch, dbar, k):
    m = tiny_model(arch, layers=4, seed=2)
    ps = prompts(4, seed=dbar + k)
    refs = [reference(m, p, 16, eos=5) for p in ps]
    for batch in ([ps[0]], ps):
        r = ppd_decode(m, batch, dbar=dbar, k=k, max_new_tokens=16, eos_token_id=5)
        for s, ref in zip(r.sequences, refs):
            assert s.tokens.tolist() == ref
            assert s.calls == len(s.tokens) and len(s.accepted_drafts) == len(s.tokens) - 1


def test_ppd_early_prediction_hits_are_reused():
    # k = vocabulary size: the early top-k always holds the greedy token, every step is pipelined
    m = tiny_model("llama", layers=4, seed=2, vocab=64)
    p = prompts(2, seed=1)
    r = ppd_decode(m, p, dbar=2, k=64, max_new_tokens=12)
    assert [s.tokens.tolist() for s in r.sequences] == [reference(m, q, 12) for q in p]
    assert all(sum(s.accepted_drafts) == 11 for s in r.sequences)


def test_ppd_refuses_bad_exit_layer():
    m = tiny_model("gpt2", layers=4)
    with pytest.raises(InputError, match="--exit-layer 4 must lie in \\[1, 3\\]"):
        ppd_decode(m, prompts(1), dbar=4)
