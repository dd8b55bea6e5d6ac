"""The two text makers of ``decoding/runs/continuations.py``: ``PlainDecoder`` (the base's forward
over one left-padded batch) writes what ``LoopDecoder`` (our decode loop) writes, greedily, for
prompts of different lengths; its sampled rows follow their seed; its cache is its own."""

import numpy as np
import pytest

from latticedraft.decoding.runs.continuations import LoopDecoder, PlainDecoder
from latticedraft.gpu.train.continuations import ContinuationSpec, continuations

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [np.array([5, 9, 2, 77, 301, 8]), np.array([41]), np.array([12, 600, 7])]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
def test_greedy_rows_equal_the_decode_loops(saved_bases, arch):
    """Left padding is masked and positions count from each row's first token: a short prompt
    padded to the longest continues as our loop continues it alone (and past end-of-text)."""
    base = saved_bases[arch]
    want = LoopDecoder(base)(PROMPTS, 12, None, 0, 0)
    got = PlainDecoder(base)(PROMPTS, 12, None, 0, 0)
    assert got.dtype == np.int64 and got.shape == (3, 12)
    assert np.array_equal(got, want)
    assert np.array_equal(PlainDecoder(base)(PROMPTS[1:2], 12, None, 0, 0), want[1:2])  # alone, unpadded


def test_sampled_rows_follow_the_seed(saved_bases):
    base = PlainDecoder(saved_bases["llama"])
    a = base(PROMPTS, 10, 1.0, 3, 0)
    assert np.array_equal(a, base(PROMPTS, 10, 1.0, 3, 0))
    assert not np.array_equal(a, base(PROMPTS, 10, 1.0, 3, 4))  # another first row, another draw
    assert not np.array_equal(a, base(PROMPTS, 10, None, 3, 0))  # T = 1 over 8192 tokens is not greedy
    assert a.min() >= 0 and a.max() < 8192
    assert base.end_ids() and base.engine == "plain"


def test_each_engine_has_its_own_cache(saved_bases, tmp_path):
    base = saved_bases["llama"]
    spec = ContinuationSpec(prompts=2, prompt_len=4, seq_len=9, sample_fraction=0.0, batch_size=2)
    stream = np.arange(1, 200, dtype=np.int32)
    loop = continuations(base, stream, spec, base / "tokenizer.json", LoopDecoder(base), root=tmp_path)
    plain = continuations(base, stream, spec, base / "tokenizer.json", PlainDecoder(base), root=tmp_path)
    assert plain.where != loop.where and plain.generated == 2  # not served the loop's rows
    assert np.array_equal(plain.rows, loop.rows)
