"""Batched verification does the work it should: one target forward per step over the drafted rows
(one per draft, each ``[root, draft...]``), no T(n) curve measured for a tree it does not run
(issue 37: ``--verify batched`` spent its first minutes measuring ~100 chains), and the output of
``model.generate(do_sample=False)``. Counted, never timed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.gpu.verify.verifier import Verifier
from tests.decoding.tiny import blockwise, reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_NEW = 20


def _repetitive(seed: int, lengths=(6, 9)):
    """Prompts that repeat a motif: context n-grams add paths from the first step."""
    rng = np.random.default_rng(seed)
    return [np.tile(rng.integers(1, 64, size=n), 3).astype(np.int64) for n in lengths]


@pytest.mark.parametrize("tree", ["auto", "fixed"])
def test_batched_verify_runs_one_forward_per_step_over_the_drafted_rows(tree, monkeypatch, own_cache):
    model = blockwise("llama", torch.float32, num_heads=4, seed=3)
    ps = _repetitive(seed=9)
    refs = [reference(model, p, MAX_NEW) for p in ps]
    forwards, steps = [], []  # (rows, width) of every target forward; (live rows, drafts per row, depth) per step
    inner = model.forward

    def counted(input_ids, *a, **k):
        forwards.append(tuple(input_ids.shape))
        return inner(input_ids, *a, **k)

    monkeypatch.setattr(model, "forward", counted)
    forward = Verifier.forward

    def recorded(self, state, roots, drafts, *a, **k):
        shapes = [np.atleast_2d(np.asarray(d)).shape for d in drafts]
        steps.append((len(drafts), max(s[0] for s in shapes), max(s[1] for s in shapes)))
        return forward(self, state, roots, drafts, *a, **k)

    monkeypatch.setattr(Verifier, "forward", recorded)
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=4)
    r = bpd_decode(
        model,
        ps,
        d,
        BpdPlan(tree=tree, sources=(ContextProposer(ContextNgrams(max_ngram=3)),)),
        Request(max_new_tokens=MAX_NEW, verify="batched"),
    )
    assert r.verify_mode == "batched"
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert len(forwards) == 1 + len(steps)  # the prefill, then one forward per step: nothing measured
    assert forwards[0] == (len(ps), max(len(p) for p in ps))
    assert len(steps) <= MAX_NEW
    for (rows, width), (b, p, depth) in zip(forwards[1:], steps):
        assert rows == b * p and width == 1 + depth  # one row per draft (padded to the row's most), root + draft
    assert not (own_cache / "cost_model").exists()


def test_cli_batched_verify_runs_the_fixed_tree():
    """``--verify batched`` drafts the fixed set of paths (the default --tree auto gives way);
    an explicit ``--tree auto`` is refused in one line."""
    from latticedraft.decoding import registry
    from latticedraft.errors import InputError

    bpd = registry.get("bpd")
    assert bpd.configure({"verify": "batched", "tree": "auto"}, {"verify"}).tree == "fixed"
    assert bpd.configure({"verify": "tree", "tree": "auto"}, {"verify"}).tree == "auto"
    with pytest.raises(InputError, match="--tree auto does not apply to --verify batched"):
        bpd.configure({"verify": "batched", "tree": "auto"}, {"verify", "tree"})
