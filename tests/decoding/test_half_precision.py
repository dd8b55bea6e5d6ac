"""What holds in half precision (the README's promise): in bfloat16 and float16 every kept token
is the argmax of the target's logits for its prefix as its verify forward computed them. A forward
over several positions rounds differently from ``generate``'s one-position steps, so the output
equals ``generate(do_sample=False)`` except where a step's top two logits lie within that rounding.

Checked against the rounding itself: with ``noise`` the largest difference between the model's
logits in the half dtype and in float32 at a position, every kept token's logit is within
``4 * noise`` of the maximum of a one-shot forward in the same dtype (the verify forward and that
forward each sit within ``noise`` of float32), and where a row leaves ``generate``'s output the
float32 logits of the two tokens lie within that bound too (a near-tie, not a wrong token)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from latticedraft.decoding.loop import speculative_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.heads import HeadProposer, LatticeOptions, make_drafter
from tests.decoding.tiny import blockwise, prompts, reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N = 24


@torch.no_grad()
def _check_rounding_bound(half, full, prompt, got, want):
    ids = torch.as_tensor(np.concatenate([prompt, np.asarray(got, dtype=np.int64)])[None])
    lo = half(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    hi = full(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    noise = (lo - hi).abs().max(-1).values
    kept = torch.as_tensor(got)[:, None]
    gap = lo.max(-1).values - lo.gather(1, kept)[:, 0]
    assert bool((gap <= 4 * noise + 1e-6).all()), (gap - 4 * noise).max()
    d = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if d is not None:
        assert abs(float(hi[d, got[d]] - hi[d, want[d]])) <= 4 * float(noise[d]) + 1e-6
    return d


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("drafter", ["parallel-base", "oracle", "none"])
def test_kept_tokens_are_the_argmax_up_to_the_dtypes_rounding(dtype, drafter):
    full = blockwise("llama", torch.float32, num_heads=4, seed=2)
    half = copy.deepcopy(full).to(dtype)
    ps = prompts(4, seed=5)
    want = [reference(half.base, p, N) for p in ps]
    opts = LatticeOptions(k=64, slots=2)
    proposers = [] if drafter == "none" else [HeadProposer(
        make_drafter("parallel-base", nbest=4, options=opts) if drafter == "parallel-base"
        else make_drafter("oracle", references=want, options=opts))]
    res = speculative_decode(half, ps, proposers, Request(max_new_tokens=N))
    for p, seq, w in zip(ps, res.sequences, want):
        got = seq.tokens.tolist()
        assert len(got) == N
        _check_rounding_bound(half.base, full.base, p, got, w)
    if drafter == "none":  # one position per call: the same rounding as generate's own steps
        assert [s.tokens.tolist() for s in res.sequences] == want


def test_the_check_catches_a_token_that_is_not_the_argmax():
    """The bound is no formality: a kept token the model does not rank first breaks it."""
    full = blockwise("llama", torch.float32, num_heads=4, seed=2)
    half = copy.deepcopy(full).to(torch.bfloat16)
    p = prompts(1, seed=5)[0]
    want = reference(half.base, p, N)
    with torch.no_grad():
        x = torch.as_tensor(np.concatenate([p, np.asarray(want[:5])])[None])
        second = int(half.base(input_ids=x).logits[0, -1].float().topk(2).indices[1])
    bad = want[:5] + [second] + want[6:]
    with pytest.raises(AssertionError):
        _check_rounding_bound(half.base, full.base, p, bad, want)
