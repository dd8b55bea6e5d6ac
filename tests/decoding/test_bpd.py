"""``decoding/bpd.py``'s option handling: what ``--do-sample`` changes in a drafter's settings."""

from latticedraft.decoding.bpd import METHOD, SAMPLED_SLOTS, DrafterSpec


def test_sampling_drafts_sampled_slots_deep_unless_slots_is_given():
    spec = METHOD.configure({"drafter": "top1", "do_sample": True, "tree": "auto", "context_ngrams": 0}, {"drafter"})
    assert (spec.slots, spec.tree, spec.context_ngrams) == (SAMPLED_SLOTS, "fixed", 0)
    given = METHOD.configure({"drafter": "top1", "do_sample": True, "slots": 6}, {"drafter", "slots"})
    assert given.slots == 6
    assert METHOD.configure({"drafter": "top1"}, {"drafter"}).slots is None  # greedy: every head
    assert DrafterSpec("parallel-base", slots=2).for_sampling().slots == 2
