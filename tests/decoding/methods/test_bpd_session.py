"""``bpd_session``: what stored acceptance counts are kept for, and how a session's own greedy steps
add to them (no decode runs to fit them; the first decode starts from the priors)."""

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.methods.bpd_session import acceptance, acceptance_key
from latticedraft.decoding.planning.acceptance import load
from latticedraft.decoding.runs.session import Session
from latticedraft.paths import default_lm_dir
from tests.decoding.tiny import tiny_model

LM = default_lm_dir()  # (before own_cache moves the cache)


def test_counts_kept_in_one_dtype_are_not_reused_in_another():
    spec = DrafterSpec("none")
    f32 = acceptance_key(Session(model=tiny_model("llama", vocab=8192)), spec, [])
    bf16 = acceptance_key(Session(model=tiny_model("llama", dtype=torch.bfloat16, vocab=8192)), spec, [])
    assert f32["dtype"] == "torch.float32" and bf16["dtype"] == "torch.bfloat16"
    assert {k: v for k, v in f32.items() if k != "dtype"} == {k: v for k, v in bf16.items() if k != "dtype"}
    assert acceptance_key(Session(model=tiny_model("llama", vocab=8192)), spec, []) == f32


@pytest.mark.skipif(not LM.is_dir(), reason="the bundled LM is built by scripts/setup.sh")
def test_greedy_decodes_count_their_steps_and_the_next_session_reads_them(own_cache):
    """Nothing is fitted before the first token: a greedy auto-tree decode records its steps, adds them to
    the counts and stores them; a new session starts from what the first stored; sampling counts nothing."""
    from latticedraft.decoding.accept.sampling import SamplingOptions
    from latticedraft.decoding.methods.bpd_session import counted_sources

    s = Session(model=tiny_model("llama", vocab=8192), lm_dir=str(LM))
    spec = DrafterSpec("none", tree="auto", lm_drafts=3)  # (the LM always has a continuation to count)
    assert sum(acceptance(s, spec).counts.values()) == 0  # none yet: the priors
    prompt = np.asarray(s.tokenizer.encode("def f(x):\n    return x + x + x + x\n").ids)
    r = s.decode([prompt], "bpd", spec, max_new_tokens=16)
    assert r.steps == []  # recorded for the counts, not returned
    first = acceptance(s, spec).counts["lm"]
    assert first > 0
    s.decode([prompt], "bpd", spec, max_new_tokens=16, sampling=SamplingOptions(seed=1))
    assert acceptance(s, spec).counts["lm"] == first  # sampled steps are not greedy data
    stored = load(acceptance_key(s, spec, counted_sources(spec)))
    assert stored is not None and stored.counts["lm"] == first
    again = Session(model=s.model, lm_dir=str(LM))
    assert acceptance(again, spec).counts["lm"] == first
