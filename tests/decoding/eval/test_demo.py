"""The demo on tiny models: which rows it runs (the CLI's default as the CLI reads it, the rows that
draft from heads only where there are heads), each timed over at least ``min_seconds``, every
output compared with HF greedy's, the table, the prompts taken by category, and the lattice
picture drawn from a pass with a gate of its own, the rescored best path marked."""

import json
import shutil

import pytest

from latticedraft.cli import decode_options
from latticedraft.decoding.eval.demo import (DEFAULT, GREEDY, PICTURE_ROW, Row, demo_rows, pick_prompts, run_demo,
                                             table)
from latticedraft.decoding.eval.rows import NGRAMS, RESCORED_HEADS, SELF_DRAFT
from latticedraft.decoding.planning.head_gate import OFF, HeadGate
from latticedraft.decoding.runs.prompt_set import read_prompt_set
from latticedraft.decoding.runs.session import Session
from latticedraft.paths import data_dir, default_lm_dir
from tests.decoding.tiny import save_bpd_bundle

pytestmark = pytest.mark.usefixtures("one_torch_thread")
NEEDS_LM = pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
ROWS = ["HF greedy", "HF prompt lookup", "HF assisted (int4 copy)", "latticedraft default (CLI)", "self-draft alone"]


def _default(model, *chat):
    m, options = decode_options("--model", str(model), *chat)
    return m.name, options


def test_rows_follow_the_cli_default_and_leave_the_heads_rows_to_models_with_heads(tmp_path):
    default = _default(tmp_path / "m", "--chat")
    with_heads = demo_rows(default, heads=True)
    assert [r.name for r in with_heads] == [*ROWS, PICTURE_ROW, "context + LM n-grams"]
    by = {r.name: r for r in with_heads}
    assert (by[DEFAULT].method, by[DEFAULT].options, by[DEFAULT].on) == (*default, "heads")
    assert by["self-draft alone"].options == SELF_DRAFT and by["self-draft alone"].on == "base"
    assert by[PICTURE_ROW].options == RESCORED_HEADS and by[PICTURE_ROW].on == "heads"
    assert RESCORED_HEADS.context_ngrams == 0 and RESCORED_HEADS.lm_drafts == 0 and RESCORED_HEADS.self_draft == "off"
    assert by["context + LM n-grams"].options == NGRAMS and NGRAMS.self_draft == "off" and NGRAMS.name == "none"
    plain = demo_rows(default, heads=False, paper=True)  # no heads: no heads rows, no paper rows
    assert [r.name for r in plain] == [*ROWS, "context + LM n-grams"] and plain[3].on == "base"
    paper = [r.name for r in demo_rows(default, heads=True, paper=True)]
    assert paper[-2:] == ["BPD top-1 (paper)", "neural BPD (paper)"]


def test_prompts_are_taken_by_spec_bench_category_in_turn():
    prompts = read_prompt_set(data_dir() / "chat-questions.jsonl")[0]
    cats = {p.record["category"] for p in prompts}
    assert {"translation", "summarization", "qa", "math_reasoning", "rag"} <= cats and len(cats) == 13
    assert all(sum(p.record["category"] == c for p in prompts) >= 2 for c in cats)  # a few of every kind
    six = [p.record["category"] for p in pick_prompts(prompts, 6)]
    assert six == ["writing", "translation", "summarization", "qa", "math_reasoning", "rag"]
    twelve = [p.record["category"] for p in pick_prompts(prompts, 12)]
    assert twelve[6:] == ["roleplay", "translation", "summarization", "qa", "math_reasoning", "rag"]
    plain = read_prompt_set(data_dir() / "prompts.jsonl", limit=5)[0]  # no categories: the first n
    assert pick_prompts(plain, 3) == plain[:3]


def test_the_table_shows_each_column_and_the_spread_of_repeated_passes():
    rows = [{"name": GREEDY, "tokens_per_s": 20.0, "x_hf_greedy": 1.0, "tokens_per_call": 1.0, "exact": True,
             "seconds": 12.3, "passes": 1, "tokens_per_s_range": [20.0, 20.0]},
            {"name": DEFAULT, "tokens_per_s": 41.0, "x_hf_greedy": 2.05, "tokens_per_call": 2.9, "exact": False,
             "seconds": 6.1, "passes": 3, "tokens_per_s_range": [39.5, 42.25]}]
    lines = table({"rows": rows}).splitlines()
    assert "tokens/s" in lines[0] and "x HF greedy" in lines[0] and "tokens/call" in lines[0]
    assert "equals greedy" in lines[0]
    assert lines[2].split()[-5:] == ["1.00x", "1.00", "yes", "12.3", "s"]
    assert "41.0" in lines[3] and "2.05x" in lines[3] and "2.90" in lines[3] and " NO " in lines[3]
    assert lines[3].endswith("6.1 s (3 passes: 39.5-42.2 tokens/s)")
    rows[1]["unsteady"] = True  # its passes' ratios disagree by more than 15%: no figure
    shown = table({"rows": rows}).splitlines()[3]
    assert "unsteady" in shown and "2.05x" not in shown


@NEEDS_LM
def test_every_row_is_timed_long_enough_and_equals_greedy_and_the_picture_marks_the_best_path(tmp_path):
    d = save_bpd_bundle(tmp_path, ["def f(x):\n    return", "import os\n"])
    s = Session(d / "heads", threads=1)
    off = HeadGate()
    off.policy = OFF  # the session's gate: no heads (as a CPU run measures its way to)
    s.learned.swap_gate(RESCORED_HEADS, off)
    notes = []
    rows = demo_rows(_default(d / "heads"), heads=True)
    summary = run_demo(s, rows, prompts_file=d / "prompts.jsonl", num_prompts=2, max_new_tokens=8,
                       out_dir=tmp_path / "demo", notify=notes.append, min_seconds=0.3)
    got = [r["name"] for r in summary["rows"]]
    assert set(got) <= {r.name for r in rows} and got[0] == GREEDY and DEFAULT in got and PICTURE_ROW in got
    skipped = [n for n in notes if n.strip().startswith("skipping")]
    assert len(got) + len(skipped) == len(rows)  # a row left out says why
    assert summary["all_exact"] and all(r["exact"] for r in summary["rows"])
    for r in summary["rows"]:
        paired = min(r["passes"], summary["rows"][0]["passes"])  # pass k against HF greedy's pass k
        assert r["passes"] >= 2 and len(r["x_hf_greedy_passes"]) == paired and isinstance(r["unsteady"], bool)
        assert r["seconds"] >= 0.3 and r["passes"] >= 1 and r["tokens"] == r["passes"] * summary["rows"][0]["tokens"] \
            / summary["rows"][0]["passes"]
        lo, hi = r["tokens_per_s_range"]
        assert lo <= r["tokens_per_s"] <= hi and r["target_calls"] >= 1
    assert summary["rows"][0]["tokens_per_call"] == 1.0 and summary["rows"][0]["x_hf_greedy"] == 1.0
    assert summary["sample"]["row"] == DEFAULT and summary["sample"]["question"].startswith("def f(x)")
    written = json.loads((tmp_path / "demo" / "demo.json").read_text())
    assert written["rows"] == summary["rows"] and written["lattice_png"] == str(tmp_path / "demo" / "lattice_step.png")
    assert (tmp_path / "demo" / "lattice_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert s.learned.gate(RESCORED_HEADS) is off  # the session's gate is back in place, untaught by the picture's pass
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["demo.json", "lattice_step.png"]


def test_a_recorded_step_keeps_the_lattice_drafters_best_path():
    from latticedraft.decoding.eval.demo import _pick_step
    from tests.decoding.tiny import ToyHeads, tiny_model

    import torch

    from latticedraft.decoding.methods.bpd import DrafterSpec

    torch.manual_seed(0)
    model = ToyHeads(tiny_model("llama", vocab=64), num_heads=4)
    # the loop records the drafter's own first path: decode a toy model with the parallel drafter
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.proposers.heads import make_drafter
    from latticedraft.decoding.registry import Request

    spec = DrafterSpec("parallel-base", nbest=4)
    drafter = make_drafter("parallel-base", options=spec.lattice_options(), nbest=4)
    ids = [torch.arange(1, 9).numpy()]
    res = bpd_decode(model, ids, drafter, BpdPlan(tree="fixed"), Request(max_new_tokens=12, record_steps=True))
    steps = [st for st in res.steps if st.sausage is not None]
    assert steps and all(st.best is not None and len(st.best) >= 1 for st in steps)
    for st in steps:  # un-rescored: the best path is the heads' top-1 of each slot
        assert [int(t) for t in st.best] == [int(t) for t in st.sausage.tokens[: len(st.best), 0]]
    picked = _pick_step(res.steps, [res.sequences[0].tokens], ids)
    assert picked is not None and picked[0] in steps


def test_a_model_without_heads_demos_its_chat_rows_without_a_lattice(tmp_path):
    """The demo on a plain chat model: prompts through its chat template, the rows that draft from
    heads left out with a note, every row equal to HF greedy, no picture."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.decoding.runs.test_chat import TEMPLATE

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, eos_token_id=0)).eval()
    m.save_pretrained(tmp_path / "chat")
    shutil.copy(data_dir() / "tokenizer" / "tokenizer.json", tmp_path / "chat" / "tokenizer.json")
    (tmp_path / "chat" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}))
    notes = []
    s = Session(tmp_path / "chat", threads=1)
    rows = demo_rows(_default(tmp_path / "chat", "--chat"), heads=False) + [
        Row(PICTURE_ROW, "heads", "ours", "bpd", RESCORED_HEADS, on="heads")]
    summary = run_demo(s, rows, prompts_file=data_dir() / "chat-questions.jsonl", num_prompts=2, max_new_tokens=6,
                       out_dir=tmp_path / "demo", notify=notes.append, chat=True, min_seconds=0)
    names = [r["name"] for r in summary["rows"]]
    assert names[:4] == ROWS[:4] and names[-1] == "context + LM n-grams" and PICTURE_ROW not in names
    assert summary["all_exact"] and summary["lattice_png"] is None
    assert any(f"skipping {PICTURE_ROW}" in n and "no heads" in n for n in notes)
    assert [p["category"] for p in summary["prompts"]] == ["writing", "translation"]
    assert summary["sample"]["question"].startswith("Write a short, friendly note")
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["demo.json"]


@NEEDS_LM
def test_a_rescorer_made_for_another_vocabulary_leaves_only_its_row_out(tmp_path):
    """Heads on a model with a vocabulary of its own (as SmolLM2's beside the bundled rescorer): the
    neural row is left out with the rescorer's one-line reason, every other row runs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    d = save_bpd_bundle(tmp_path, ["def f(x):\n    return", "import os\n"])
    GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=8, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "other")
    notes = []
    s = Session(d / "heads", rescorer_dir=tmp_path / "other", threads=1)
    rows = [r for r in demo_rows(_default(d / "heads"), heads=True, paper=True)
            if r.name in (GREEDY, DEFAULT, "neural BPD (paper)", "BPD top-1 (paper)")]
    summary = run_demo(s, rows, prompts_file=d / "prompts.jsonl", num_prompts=2, max_new_tokens=6,
                       out_dir=tmp_path / "demo", notify=notes.append, min_seconds=0)
    names = [r["name"] for r in summary["rows"]]
    assert names == [GREEDY, DEFAULT, "BPD top-1 (paper)"] and summary["all_exact"]
    skipped = [n for n in notes if n.strip().startswith("skipping neural BPD")]
    assert len(skipped) == 1 and "vocabulary" in skipped[0] and "\n" not in skipped[0]


def test_no_picture_says_why_the_heads_drew_none_when_the_lm_is_missing(tmp_path):
    """Issue 63, class E: heads without the bundled 4-gram (the offline fallback's case): the picture's
    row is left out and the report says the LM is missing, not that the model has no heads."""
    from latticedraft.cli.demo import report

    d = save_bpd_bundle(tmp_path, ["def f(x):\n    return", "import os\n"])
    s = Session(d / "heads", lm_dir=tmp_path / "no-4gram", threads=1)
    rows = [r for r in demo_rows(_default(d / "heads"), heads=True) if r.name in (GREEDY, PICTURE_ROW)]
    summary = run_demo(s, rows, prompts_file=d / "prompts.jsonl", num_prompts=1, max_new_tokens=4,
                       out_dir=tmp_path / "demo", notify=lambda m: None, min_seconds=0)
    assert summary["lattice_png"] is None and "no-4gram" in summary["no_picture"]
    last = report(summary).splitlines()[-1]
    assert last.startswith("no lattice picture: its row") and "no-4gram" in last and "has no heads" not in last
