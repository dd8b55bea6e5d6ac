"""The fused draft forward (gpu/verify/fused_draft.py): the eager quantized stack's logits and
cache writes up to float rounding, on every architecture the lean path runs, at one and several
rows, with and without a mask, over caches long enough to split attention into chunks; a build
that fails leaves nothing behind and the draft falls back to the eager path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from latticedraft.gpu.masks import CAUSAL
from latticedraft.gpu.models.quantized import Scheme
from latticedraft.gpu.verify import fused_draft
from latticedraft.gpu.verify.fused_draft import FusedDraft, why_not
from latticedraft.gpu.verify.kv import KVCache
from latticedraft.gpu.verify.lean import LeanStack, stack_for
from tests.decoding.tiny import tiny_model

VOCAB = 256


def _prefilled(model, rows: int, n: int, seed: int = 0):
    """A cache of n tokens per row written by the float stack, and the ids."""
    fl = stack_for(model)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, n), generator=g)
    pos = torch.arange(n)[None].expand(rows, -1)
    cache = KVCache(rows, fl.num_layers)
    cache.reserve(n)
    with torch.inference_mode():
        fl.run(fl.embed(ids, pos), 0, fl.num_layers, CAUSAL, pos, cache)
    cache.append_valid(np.ones((rows, n), dtype=bool), pos.numpy())
    return cache


def _both(stack, fused, cache, x, p, mask):
    """(eager logits, eager new keys/values, fused logits, fused new keys/values) of one token."""
    n = cache.length
    out = []
    with torch.inference_mode():
        for f in (None, fused):
            stack.fused = f
            cache.reserve(1)
            logits = stack.token_logits(x, p, None if mask is None else mask[:, None, None], cache)
            out += [logits, cache.store[..., n, :].clone()]
            cache.truncate(n)
    stack.fused = None
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gpt2"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_fused_forward_equals_the_eager_draft_up_to_rounding(arch, rows, kind):
    model = tiny_model(arch, vocab=VOCAB, layers=3, window=150)
    stack = LeanStack(model, Scheme(kind))
    fused, why = FusedDraft.of(stack)
    assert why is None, why
    n = 130  # > 64 slots: attention runs in chunks
    cache = _prefilled(model, rows, n)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (rows, 1), generator=g)
    p = torch.full((rows, 1), n)
    mask = torch.ones(rows, n + 1, dtype=torch.bool)
    mask[0, 5:40] = False  # a row that must not see some slots (padding, a window)
    for m in (None, mask):
        a, ka, b, kb = _both(stack, fused, cache, x, p, m)
        scale = a.abs().max()
        assert (a - b).abs().max() <= 0.02 * scale, (arch, m is None)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert (ka - kb).abs().max() <= 0.01 * ka.abs().max()


def test_the_mask_matters():
    """Hiding slots changes the fused logits as it changes the eager ones (the mask is read)."""
    model = tiny_model("llama", vocab=VOCAB, layers=2)
    stack = LeanStack(model, Scheme("int4"))
    fused, _ = FusedDraft.of(stack)
    cache = _prefilled(model, 1, 80)
    x, p = torch.tensor([[7]]), torch.tensor([[80]])
    mask = torch.ones(1, 81, dtype=torch.bool)
    mask[0, :70] = False
    open_, _, _, _ = _both(stack, fused, cache, x, p, None)
    _, _, hidden, _ = _both(stack, fused, cache, x, p, mask)
    a, _, b, _ = _both(stack, fused, cache, x, p, mask)
    assert (open_ - hidden).abs().max() > 10 * (a - b).abs().max()


def test_what_it_does_not_run_is_named():
    model = tiny_model("llama", vocab=VOCAB)
    assert "not quantized" in why_not(LeanStack(model))
    half = tiny_model("llama", vocab=VOCAB, dtype=torch.bfloat16)
    assert "float32 cache" in why_not(LeanStack(half, Scheme("int4")))


def test_without_a_compiler_the_draft_runs_eagerly(monkeypatch):
    monkeypatch.setattr(fused_draft, "compiler", lambda: None)
    stack = LeanStack(tiny_model("llama", vocab=VOCAB), Scheme("int4"))
    fused, why = FusedDraft.of(stack)
    assert fused is None and why.startswith("no C++ compiler") and "\n" not in why


def test_a_failed_build_leaves_nothing_behind(monkeypatch, tmp_path):
    bad = tmp_path / "broken.cpp"
    bad.write_text("this is not C++\n")
    monkeypatch.setattr(fused_draft, "SOURCE", bad)
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path / "cache"))
    path, why = fused_draft.library_path()
    assert why is None
    error = fused_draft.build(path)
    assert error and error.startswith("the compiler failed") and "\n" not in error
    assert not path.exists() and list(path.parent.iterdir()) == []


def test_the_build_is_keyed_by_source_torch_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path))
    first, _ = fused_draft.library_path()
    monkeypatch.setattr(fused_draft, "cpu_signature", lambda: "another CPU | avx2")
    other, _ = fused_draft.library_path()
    assert first.parent.parent == tmp_path / "kernels" and first != other
