"""The head gate: every arm tried first, then the measured faster arm per bucket, with periodic
exploration of the other."""

import pytest

from latticedraft.decoding.planning.head_gate import BLOCK, EXPLORE, EXPLORE_BLOCKS, GATED, OFF, WARMUP, HeadGate


def test_without_a_context_match_the_heads_compete_with_a_plain_step():
    g = HeadGate()
    picks = []
    for _ in range(40):
        arm = g.choose(0)
        picks.append(arm)
        g.update(0, arm, tokens=2 if arm else 1, seconds=0.008 if arm else 0.005)  # heads: 250 vs 200 tok/s
    assert picks[:2 * WARMUP] == [True] * WARMUP + [False] * WARMUP
    assert sum(picks[2 * WARMUP:]) >= len(picks) - 2 * WARMUP - 3


def test_tries_both_arms_then_follows_the_faster_with_exploration():
    g = HeadGate()
    seen = []
    n = 20  # this test stays within the first block (the buckets decide): 20 + 40 updates
    for _ in range(n):
        arm = g.choose(2)
        seen.append(arm)
        # heads: 2 tokens in 10 ms; context only: 3 tokens in 5 ms -> context only is 3x faster
        g.update(2, arm, tokens=2 if arm else 3, seconds=0.010 if arm else 0.005)
    assert seen[:WARMUP] == [True] * WARMUP and seen[WARMUP:2 * WARMUP] == [False] * WARMUP
    late = seen[2 * WARMUP:]
    assert late.count(True) == len([d for d in range(2 * WARMUP + 1, n + 1) if d % EXPLORE == 0]) > 0
    # the buckets are independent: bucket 3 still warms up, and its rates decide for it alone
    assert g.choose(3) is True
    for _ in range(40):
        arm = g.choose(3)
        g.update(3, arm, tokens=4 if arm else 1, seconds=0.005)
    assert g.rate(3)[1] > g.rate(3)[0] and sum(g.choose(3) for _ in range(30)) >= 28


def test_matches_beyond_the_last_bucket_share_it():
    g = HeadGate()
    assert g.bucket(9) == g.bucket(3) == 3 and g.bucket(-1) == 0


def test_a_step_is_charged_the_heads_it_drafted_from_not_those_it_computed_for_the_next(monkeypatch):
    """The heads a step drafts from are computed in the verify call before it: the gate's
    seconds for a step's arm carry that cost, and a context-only step that computes the next
    step's heads is not charged for them. Heads made 100 ms slow (a tiny model's step takes ~2 ms);
    the gate alternates its arms."""
    import time

    import numpy as np
    import torch

    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
    from latticedraft.gpu.verify import forward
    from latticedraft.gpu.verify.cost_model import CostModel
    from tests.decoding.tiny import blockwise, prompts

    SLOW = 0.1
    slow = forward.Forward.draft_heads_at

    def slow_heads(self, *a, **k):
        time.sleep(SLOW)
        return slow(self, *a, **k)

    monkeypatch.setattr(forward.Forward, "draft_heads_at", slow_heads)

    class Alternating(HeadGate):
        def __init__(self):
            super().__init__()
            self.calls, self.seen = 0, []

        def choose(self, match):
            self.calls += 1
            return self.calls % 2 == 0

        def update(self, match, heads, tokens, seconds):
            self.seen.append((heads, seconds))

    gate = Alternating()
    n = np.arange(1, 33)
    cost = CostModel(tuple(n.tolist()), tuple((1.0 + 0.05 * (n - 1)).tolist()))
    with torch.no_grad():
        bpd_decode(
            blockwise("llama", num_heads=3),
            prompts(1, seed=4),
            make_drafter("top1", options=LatticeOptions(k=4)),
            BpdPlan(tree="auto", sources=(ContextProposer(ContextNgrams(max_ngram=2)),), cost=cost, gate=gate),
            Request(max_new_tokens=24),
        )
    steps = gate.seen[1:]  # (the first step drafts from the prefill's heads, which no step paid for)
    assert {h for h, _ in steps} == {True, False}
    assert all(s >= SLOW for h, s in steps if h)
    assert all(s < SLOW for h, s in steps if not h)


@pytest.mark.parametrize("off_faster", [True, False])
def test_blocks_of_steps_choose_between_the_gated_buckets_and_no_heads(off_faster):
    """Over whole blocks (what a step's own seconds miss, such as the heads slowing the steps after
    them, shows there): the gated policy runs the first block, no heads the second, then the faster
    policy, and the other one block in EXPLORE_BLOCKS; under the off policy no step computes heads."""
    g = HeadGate()
    policies = []
    for _ in range(40 * BLOCK):
        policy = g.policy
        arm = g.choose(1)
        assert not arm or policy == GATED
        if len(policies) == 0 or g.left == BLOCK:
            policies.append(policy)
        # steps under the gated policy: 3 tokens in 10 ms; without heads 2 tokens in 5 ms (or 12 ms)
        g.update(
            1,
            arm,
            tokens=3 if policy == GATED else 2,
            seconds=0.010 if policy == GATED else (0.005 if off_faster else 0.012),
        )
    assert policies[:2] == [GATED, OFF]
    best, other = (OFF, GATED) if off_faster else (GATED, OFF)
    rest = policies[2:]
    assert rest.count(other) == sum(1 for b in range(3, len(policies) + 1) if b % EXPLORE_BLOCKS == 1)
    assert rest.count(best) == len(rest) - rest.count(other) > 0.8 * len(rest)
    assert (g.block_rate()[OFF] > g.block_rate()[GATED]) == off_faster


@pytest.mark.parametrize("slots", [None, 2])
def test_under_the_off_policy_no_heads_are_computed_and_the_output_stays_exact(monkeypatch, slots):
    """A gate whose policy is ``OFF`` skips the heads at the prefill too (fixed batches and a
    continuous batch, whose joining rows match the running batch); the output is ``generate``'s."""
    import numpy as np
    import torch

    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
    from latticedraft.gpu.verify import forward
    from latticedraft.gpu.verify.cost_model import CostModel
    from tests.decoding.tiny import blockwise, prompts, reference

    calls = []
    real = forward.Forward.draft_heads_at
    monkeypatch.setattr(forward.Forward, "draft_heads_at", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    model, ps = blockwise("llama", num_heads=3), prompts(4, seed=6)
    n = np.arange(1, 33)
    cost = CostModel(tuple(n.tolist()), tuple((1.0 + 0.05 * (n - 1)).tolist()))
    for policy in (OFF, GATED):
        gate = HeadGate()
        gate.policy = policy
        calls.clear()
        with torch.no_grad():
            r = bpd_decode(
                model,
                ps,
                make_drafter("top1", options=LatticeOptions(k=4)),
                BpdPlan(tree="auto", sources=(ContextProposer(ContextNgrams(max_ngram=2)),), cost=cost, gate=gate),
                Request(max_new_tokens=20, in_flight=slots),
            )
        assert [q.tokens.tolist() for q in r.sequences] == [reference(model, p, 20) for p in ps]
        assert (len(calls) == 0) == (policy == OFF)
