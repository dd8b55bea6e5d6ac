"""The head gate: every arm tried first, then the measured faster arm per bucket, with periodic
exploration of the other."""

from latticedraft.decoding.planning.head_gate import EXPLORE, WARMUP, HeadGate


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
    for _ in range(200):
        arm = g.choose(2)
        seen.append(arm)
        # heads: 2 tokens in 10 ms; context only: 3 tokens in 5 ms -> context only is 3x faster
        g.update(2, arm, tokens=2 if arm else 3, seconds=0.010 if arm else 0.005)
    assert seen[:WARMUP] == [True] * WARMUP and seen[WARMUP:2 * WARMUP] == [False] * WARMUP
    late = seen[2 * WARMUP:]
    assert late.count(True) == len([d for d in range(2 * WARMUP + 1, 201) if d % EXPLORE == 0])
    # the buckets are independent: bucket 3 still warms up, and its rates decide for it alone
    assert g.choose(3) is True
    for _ in range(40):
        arm = g.choose(3)
        g.update(3, arm, tokens=4 if arm else 1, seconds=0.005)
    assert g.rate(3)[1] > g.rate(3)[0] and sum(g.choose(3) for _ in range(30)) >= 28


def test_matches_beyond_the_last_bucket_share_it():
    g = HeadGate()
    assert g.bucket(9) == g.bucket(3) == 3 and g.bucket(-1) == 0
