"""IncrementalLM and its beams: the same logits as a whole-history transformers forward, through
LeanStack where the model allows it and through transformers otherwise."""

import numpy as np
import pytest
import torch

from latticedraft.gpu.verify.incremental import IncrementalLM, lean_stack
from tests.decoding.tiny import ToyHeads, tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def full_logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.as_tensor([list(ids)])).logits[0, -1]


@pytest.mark.parametrize("arch,lean", [("gpt2", True), ("llama", True), ("mistral", True), ("mistral", False)])
def test_incremental_logits_equal_a_whole_history_forward(arch, lean):
    model = tiny_model(arch, torch.float64, seed=3)  # the tiny Mistral's window (7) is shorter than the history
    lm = IncrementalLM(model, "auto" if lean else None)
    assert (lm.stack is not None) == lean
    rng = np.random.default_rng(0)
    history = rng.integers(0, 64, size=9)
    torch.testing.assert_close(lm.next_logits(history, room=3), full_logits(model, history), rtol=1e-9, atol=1e-9)
    pushed = list(history)
    for t in rng.integers(0, 64, size=3):
        pushed.append(int(t))
        torch.testing.assert_close(lm.push(int(t)), full_logits(model, pushed), rtol=1e-9, atol=1e-9)
    lm.rewind()
    assert len(lm.fed) == 9
    longer = np.concatenate([history, [5, 6]])  # continues what it holds: only 2 tokens fed
    calls = lm.calls
    torch.testing.assert_close(lm.next_logits(longer), full_logits(model, longer), rtol=1e-9, atol=1e-9)
    assert lm.calls == calls + 1 and len(lm.fed) == 11
    other = np.concatenate([history[:4], [1, 2, 3]])  # diverges: starts over
    torch.testing.assert_close(lm.next_logits(other), full_logits(model, other), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("arch,lean", [("llama", True), ("gpt2", True), ("mistral", True), ("mistral", False)])
def test_beams_continue_the_history_each_with_its_own_cache(arch, lean):
    model = tiny_model(arch, torch.float64, seed=4)
    lm = IncrementalLM(model, "auto" if lean else None)
    history = np.arange(1, 11)
    lm.next_logits(history, room=3)
    fork = lm.beams()
    fork.keep(np.array([0, 0, 0]))
    seqs = [[7], [8], [9]]
    out = fork.step(np.array([7, 8, 9]))
    for r, s in enumerate(seqs):
        torch.testing.assert_close(out[r], full_logits(model, list(history) + s), rtol=1e-9, atol=1e-9)
    fork.keep(np.array([2, 0]))  # beam 2 and beam 0 survive, in that order
    seqs = [seqs[2] + [4], seqs[0] + [5]]
    out = fork.step(np.array([4, 5]))
    for r, s in enumerate(seqs):
        torch.testing.assert_close(out[r], full_logits(model, list(history) + s), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lm.push(3), full_logits(model, list(history) + [3]), rtol=1e-9, atol=1e-9)


def test_lean_stack_declines_wrappers():
    assert lean_stack(tiny_model("mistral", window=7)) is not None
    assert lean_stack(ToyHeads(tiny_model("llama"))) is None
