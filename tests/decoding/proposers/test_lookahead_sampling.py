"""Lookahead decoding under lossless sampling: its n-gram pool's paths are deterministic drafts of
the history, and verification keeps what equals the target's argmax under the run's Gumbel
noise (``accept/sampling.py``), so every row emits exactly the plain sampler's tokens
(``tests.decoding.tiny.sampled_reference``), whatever the window, the pool or the batch.
"""

import numpy as np
import pytest
import torch

from latticedraft.decoding.accept.sampling import SamplingOptions
from latticedraft.decoding.methods.lookahead import lookahead_decode
from tests.decoding.tiny import sampled_reference, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
V = 8


@pytest.mark.parametrize("W,N,G,verify,opts", [
    (2, 2, 3, "tree", SamplingOptions(temperature=0.7, top_k=0, top_p=1.0, seed=1)),
    (3, 3, 2, "tree", SamplingOptions(temperature=1.3, top_k=7, top_p=0.97, seed=2)),
    (2, 3, 3, "batched", SamplingOptions(temperature=1.0, top_k=6, top_p=0.95, seed=3)),
])
def test_every_row_emits_the_plain_samplers_tokens(W, N, G, verify, opts):
    model = tiny_model("llama", torch.float64, seed=3, vocab=V)
    prompt = np.array([1, 2, 3, 1, 2, 3, 1, 2], dtype=np.int64)  # repeats: the pool has candidates at once
    prompts = [prompt, np.array([4, 5, 4, 5, 4], dtype=np.int64)]
    r = lookahead_decode(model, prompts, W=W, N=N, G=G, max_new_tokens=20, prompt_as_reference=True,
                         verify=verify, sampling=opts, first_row=2)
    for i, (p, q) in enumerate(zip(prompts, r.sequences)):
        assert q.tokens.tolist() == sampled_reference(model, p, 20, opts, row=2 + i)
    assert sum(sum(q.accepted_drafts) for q in r.sequences) > 0  # the pool's drafts were kept on the way


def test_seed_reproduces_and_rows_do_not_depend_on_the_batch():
    model = tiny_model("gpt2", torch.float64, seed=1, vocab=V)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, V, size=n) for n in (4, 9, 6)]

    def out(ps, seed=7, first_row=0):
        o = SamplingOptions(temperature=1.0, top_k=0, top_p=1.0, seed=seed)
        r = lookahead_decode(model, ps, W=3, N=3, G=3, max_new_tokens=20, sampling=o, first_row=first_row)
        return [q.tokens.tolist() for q in r.sequences]

    both = out(prompts)
    assert both == out(prompts)
    assert out(prompts[1:], first_row=1) == both[1:]  # row 1 samples with its own noise either way
    assert out(prompts, seed=8) != both
