"""The base's continuations of corpus prompts (``gpu/train/continuations.py``, made by the decode
loop that ``decoding/runs/continuations.py`` passes in): what the rows hold, that greedy rows are
the base's greedy output, that the cache is keyed and resumable."""

import json

import numpy as np
import pytest
import torch

from latticedraft.decoding.runs.continuations import LoopDecoder
from latticedraft.errors import InputError
from latticedraft.gpu.models.hf import load_causal_lm
from latticedraft.gpu.train import continuations as made
from latticedraft.gpu.train.continuations import ContinuationSpec, prompt_offsets

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STREAM = (np.arange(400, dtype=np.int32) * 37 + 5) % 8000 + 1
SPEC = ContinuationSpec(prompts=6, prompt_len=5, seq_len=12, sample_fraction=0.5, batch_size=2, seed=4)


def _tok(base_dir):
    return base_dir / "tokenizer.json"


def continuations(base_dir, stream, spec, tokenizer_path, root, decoder=None):
    """``continuations`` made by our decode loop (``LoopDecoder``) unless ``decoder`` is given."""
    decoder = decoder or LoopDecoder(base_dir, tokenizer_path)
    return made.continuations(base_dir, stream, spec, tokenizer_path, decoder, root=root)


class RowNumbers:
    """A stand-in ``BaseDecoder`` (no model): row r's continuation is r, ``short`` tokens too few."""

    def __init__(self, short=0):
        self.calls, self.short = [], short

    def __call__(self, prompts, new_tokens, temperature, seed, first_row):
        self.calls.append((first_row, len(prompts), temperature))
        return np.array([[first_row + r] * (new_tokens - self.short) for r in range(len(prompts))])


def test_the_caller_passes_the_decoder(saved_bases, tmp_path):
    """``gpu/`` knows no decode loop: whatever ``decoder`` the caller passes continues the prompts,
    greedy batches first (temperature None), then sampled ones; a wrong shape is refused."""
    base_dir, d = saved_bases["llama"], RowNumbers()
    c = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "a", decoder=d)
    assert d.calls == [(0, 2, None), (2, 1, None), (3, 2, 1.0), (5, 1, 1.0)]
    assert c.rows[:, 5:].tolist() == [[r] * 7 for r in range(6)] and c.generated == 6
    with pytest.raises(InputError, match=r"shape \(2, 6\), not \(2, 7\)"):
        continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "b", decoder=RowNumbers(short=1))


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


def test_a_killed_run_keeps_its_finished_batches(saved_bases, tmp_path):
    base_dir = saved_bases["mistral"]
    full = continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "full")
    loop, calls = LoopDecoder(base_dir, _tok(base_dir)), []

    def dies_on_the_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return loop(*args)

    with pytest.raises(KeyboardInterrupt):
        continuations(base_dir, STREAM, SPEC, _tok(base_dir), root=tmp_path / "part", decoder=dies_on_the_third)
    (where,) = (tmp_path / "part").iterdir()
    assert sorted(f.name for f in where.glob("batch-*")) == ["batch-00000-00002.npy", "batch-00002-00003.npy"]
    assert not list(where.glob(".*"))  # nothing half-written
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


def test_chat_rows_answer_questions_the_base_wrote_itself(chat_base, tmp_path):
    """--distill-chat: the first rows' prompts are the template's user header continued by the base
    (sampled, cut at the end id) then rendered with the assistant's turn open; greedy chat rows are
    the base's greedy answer; the corpus rows after them are as without chat."""
    from transformers import AutoTokenizer

    base_dir = chat_base
    spec = ContinuationSpec(prompts=8, prompt_len=5, seq_len=24, sample_fraction=0.5, batch_size=2, seed=4,
                            chat_fraction=0.5, question_tokens=6)
    c = continuations(base_dir, STREAM, spec, _tok(base_dir), root=tmp_path / "c")
    assert c.rows.shape == (8, 24) and c.greedy_rows == 2 + 2  # half of each part is greedy
    (where,) = (tmp_path / "c").iterdir()
    questions = json.loads((where / "questions.json").read_text())
    assert len(questions) == 4 and len(set(questions)) > 1  # sampled, so not all alike
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    base = load_causal_lm(base_dir)
    for r, q in enumerate(questions[:2]):  # chat rows 0, 1 greedy
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert c.rows[r, : len(ids)].tolist() == ids, r
        x = torch.as_tensor([ids])
        want = base.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=24 - len(ids),
                             min_new_tokens=24 - len(ids), pad_token_id=0)[0]
        assert c.rows[r].tolist() == want.tolist(), r
    plain = continuations(base_dir, STREAM, ContinuationSpec(**{**spec.__dict__, "prompts": 4, "chat_fraction": 0.0}),
                          _tok(base_dir), root=tmp_path / "p")
    assert np.array_equal(c.rows[4:6], plain.rows[:2])  # greedy corpus rows: as without chat (sampled ones
    assert np.array_equal(c.rows[6:, :5], plain.rows[2:, :5])  # draw by their row number in the whole set)
    again = continuations(base_dir, STREAM, spec, _tok(base_dir), root=tmp_path / "c")
    assert again.generated == 0 and np.array_equal(again.rows, c.rows)


def test_chat_rows_need_a_chat_template(saved_bases, tmp_path):
    spec = ContinuationSpec(prompts=2, prompt_len=5, seq_len=24, batch_size=2, chat_fraction=1.0)
    with pytest.raises(InputError, match="--distill-chat: .* has no chat template"):
        continuations(saved_bases["llama"], STREAM, spec, _tok(saved_bases["llama"]), root=tmp_path)
