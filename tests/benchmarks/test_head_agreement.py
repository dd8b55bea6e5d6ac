"""``benchmarks/head_agreement.py`` and ``benchmarks/draft_model_speed.py`` on a tiny setting (the
bundled heads and draft model, 2 held-back prompts, 8 tokens): JSON, table, agreement offsets (head 1
is the base: agreement 1), every output equal to greedy. The real runs are in benchmarks/results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from latticedraft.decoding.runs.loaders import default_model_dir  # noqa: E402
from latticedraft.paths import data_dir  # noqa: E402

READY = (default_model_dir() / "heads_config.json").is_file() and (data_dir() / "rescorer-small").is_dir()
pytestmark = [pytest.mark.skipif(not READY, reason="bundled models not built (bash scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def two_prompts(tmp_path_factory):
    p = tmp_path_factory.mktemp("p") / "two.jsonl"
    p.write_text("".join((ROOT / "benchmarks" / "prompts" / "heldback-code.jsonl").read_text().splitlines(True)[:2]))
    return p


def test_head_agreement_tiny(two_prompts, tmp_path, capsys):
    import head_agreement as b

    out = tmp_path / "ha.json"
    assert b.main(["--heads", f"h={default_model_dir()}", "--draft-models", f"d={data_dir() / 'rescorer-small'}",
                   "--prompts", f"two={two_prompts}", "--max-new-tokens", "8", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    row = doc["sets"]["two"]
    ag = row["heads"]["h"]["agreement"]
    assert ag["top1"][0] == 1.0 and ag["positions"][0] == 2 * 8  # head 1 is the base: its greedy tokens
    assert all(0.0 <= x <= y <= 1.0 for x, y in zip(ag["top1"], ag["topk"]))
    assert ag["positions"] == [2 * (8 - j) for j in range(len(ag["positions"]))]
    assert set(row["heads"]["h"]["drafters"]) == {"top1", "parallel-base p=8 slots=3"}
    assert doc["all_exact"] and row["draft_models"]["d"]["tokens_per_call"] >= 1.0
    assert "| h |" in capsys.readouterr().out


def test_prompt_sets_leave_out_the_tuning_split():
    import head_agreement as b

    from head_agreement import CALIBRATION_PROMPTS

    sets = b.prompt_sets(None)
    _, idx = sets["bundled held-out"]
    assert not set(idx) & set(range(100)[CALIBRATION_PROMPTS]) and sets["held-back code"][1] is None


def test_draft_model_speed_tiny(two_prompts, tmp_path):
    import draft_model_speed as b

    out = tmp_path / "d.json"
    assert b.main(["--draft-models", f"d={data_dir() / 'rescorer-small'}", "--prompts", str(two_prompts),
                   "--max-new-tokens", "8", "--repeats", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["draft_models"]["d"]
    assert r["exact"] and r["tokens_per_call"] >= 1.0 and r["draft_step_s"] > 0 and r["predicted_speedup"] > 0


def test_head_agreement_over_a_draft_vocabulary(two_prompts, tmp_path, capsys):
    """``--draft-vocab V``: heads 2..h choose among their V most frequent tokens (agreement and the
    drafters alike); columns holding the whole vocabulary, in any order, agree as the full vocabulary."""
    import numpy as np
    import torch

    import head_agreement as b
    from latticedraft.decoding.runs.session import Session

    out = tmp_path / "ha.json"
    assert b.main(["--heads", f"h={default_model_dir()}", "--prompts", f"two={two_prompts}", "--max-new-tokens", "8",
                   "--draft-vocab", "16", "--drafters", "top1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["draft_vocab"] == 16 and doc["all_exact"]
    assert "the heads' 16 most frequent tokens" in capsys.readouterr().out
    s = Session(default_model_dir(), threads=None)
    ids = [np.array([5, 9, 12, 40])]
    refs = [np.array([7, 3, 9, 1, 22, 5])]
    vocab = s.model.base.get_output_embeddings().weight.shape[0]
    full = b.head_agreement(s.model, ids, refs, 4)
    assert b.head_agreement(s.model, ids, refs, 4, torch.randperm(vocab)) == full


def test_chat_prompt_sets_render_through_the_template_and_sample_by_seed(chat_base, tmp_path):
    """``--chat``: chat records (``messages``, Spec-Bench's ``turns``: the first) go through the model's
    chat template, plain ones stay plain; ``--sample N --seed S`` draws the same N records each time.
    Without ``--chat`` a chat record is refused in one line."""
    import numpy as np

    import head_agreement as b
    from latticedraft.decoding.runs.session import Session
    from latticedraft.errors import InputError

    f = tmp_path / "p.jsonl"
    f.write_text('{"turns": ["Name a colour.", "And another."]}\n{"messages": [{"role": "user", "content": "hi"}]}\n'
                 '{"prompt": "def f(x):"}\n{"prompt": "import os"}\n')
    s = Session(chat_base, threads=None)
    idx, ids = b.prompt_ids(s, f, None, True, 0, 0)
    t = s.chat_template()
    assert idx == [0, 1, 2, 3]
    assert np.array_equal(ids[0], t.ids([{"role": "user", "content": "Name a colour."}]))
    assert np.array_equal(ids[1], t.ids([{"role": "user", "content": "hi"}]))
    assert ids[2].tolist() == s.tokenizer.encode("def f(x):").ids
    drawn = b.prompt_ids(s, f, None, True, 2, 5)[0]
    assert len(drawn) == 2 and drawn == sorted(drawn) and drawn == b.prompt_ids(s, f, None, True, 2, 5)[0]
    with pytest.raises(InputError, match="is a chat record"):
        b.prompt_ids(s, f, None, False, 0, 0)
