"""The base's continuations of corpus prompts (``gpu/train/continuations.py``): what the rows hold,
that greedy rows are the base's greedy output, that the cache is keyed and resumable."""

import numpy as np
import pytest
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.models.hf import load_causal_lm
from latticedraft.gpu.train import continuations as cont
from latticedraft.gpu.train.continuations import ContinuationSpec, continuations, prompt_offsets

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STREAM = (np.arange(400, dtype=np.int32) * 37 + 5) % 8000 + 1
SPEC = ContinuationSpec(prompts=6, prompt_len=5, seq_len=12, sample_fraction=0.5, batch_size=2, seed=4)


def _tok(base_dir):
    return base_dir / "tokenizer.json"


def test_rows_are_prompts_then_the_bases_own_continuation(saved_bases, tmp_path):
    base_dir = saved_bases["llama"]
    c = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path)
    assert c.rows.shape == (6, 12) and c.rows.dtype == np.int32 and c.greedy_rows == 3 and c.generated == 6
    offsets = prompt_offsets(len(STREAM), SPEC)
    for r, o in enumerate(offsets):
        assert np.array_equal(c.rows[r, :5], STREAM[o : o + 5])
    base = load_causal_lm(base_dir)
    for r in range(3):  # greedy rows: the base's greedy continuation, token for token
        ids = torch.as_tensor(c.rows[r : r + 1, :5], dtype=torch.long)
        want = base.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=7,
                             min_new_tokens=7, pad_token_id=0)[0, 5:]
        assert np.array_equal(c.rows[r, 5:], want.numpy()), r
    greedy_again = [not np.array_equal(c.rows[r], c.rows[r - 3]) for r in range(3, 6)]
    assert any(greedy_again)  # sampled rows are not the greedy ones (T = 1 over 8192 tokens)


def test_rows_do_not_depend_on_the_batching(saved_bases, tmp_path):
    base_dir = saved_bases["gpt2"]
    a = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "a")
    b = continuations(base_dir, STREAM, ContinuationSpec(**{**SPEC.__dict__, "batch_size": 3}), _tok(base_dir),
                      root=tmp_path / "b")
    assert np.array_equal(a.rows, b.rows)


def test_a_killed_run_keeps_its_finished_batches(saved_bases, tmp_path, monkeypatch):
    base_dir = saved_bases["mistral"]
    full = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "full")
    real, calls = cont._decode_batch, []

    def dies_on_the_third(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(cont, "_decode_batch", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "part")
    (where,) = (tmp_path / "part").iterdir()
    assert sorted(f.name for f in where.glob("batch-*")) == ["batch-00000-00002.npy", "batch-00002-00003.npy"]
    assert not list(where.glob(".*"))  # nothing half-written
    monkeypatch.setattr(cont, "_decode_batch", real)
    again = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "part")
    assert again.generated == 3 and np.array_equal(again.rows, full.rows)
    assert continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "part").generated == 0


def test_the_cache_is_keyed_by_the_settings_and_the_weights(saved_bases, tmp_path):
    import os

    base_dir = saved_bases["llama"]
    first = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path)
    other = continuations(base_dir, STREAM, ContinuationSpec(**{**SPEC.__dict__, "seed": 5}), _tok(base_dir),
                          root=tmp_path)
    assert other.generated == 6 and other.where != first.where
    w = base_dir / "model.safetensors"
    st = w.stat()
    os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # new weights
    try:
        assert continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path).where != first.where
    finally:
        os.utime(w, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_too_short_a_corpus_is_refused(saved_bases, tmp_path):
    with pytest.raises(InputError, match="too few for prompts of --prompt-len 5"):
        continuations(saved_bases["llama"], STREAM[:5], SPEC, _tok(saved_bases["llama"]), root=tmp_path)
