"""``benchmarks/spec_bench.py`` on a tiny chat model and a tiny question file: the six categories
sampled, questions through the chat template (MT-bench's second turn after the first and its
answer), every greedy row (batch 1 and 4) equal to HF greedy, the sampled rows and the table."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.benchmarks.bundled import MARKS  # also puts benchmarks/ on the import path

pytestmark = MARKS


def test_sample_questions_draws_every_category(tmp_path):
    import spec_bench as b

    qs = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
          for i, c in enumerate(["writing", "coding", *b.CATEGORIES[1:]] * 3)]
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps(q) + "\n" for q in qs))
    got = b.sample_questions(f, 2, seed=0)
    assert [q["bench_category"] for q in got] == [c for c in b.CATEGORIES for _ in range(2)]
    assert got == b.sample_questions(f, 2, seed=0) and got != b.sample_questions(f, 2, seed=1)


def tiny_chat_model(tmp_path):
    """A random 2-layer Llama with the bundled tokenizer and a chat template, saved in tmp_path/chat."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from latticedraft.paths import data_dir
    from tests.decoding.runs.test_chat import TEMPLATE

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, eos_token_id=0)).eval()
    model = tmp_path / "chat"
    m.save_pretrained(model)
    shutil.copy(data_dir() / "tokenizer" / "tokenizer.json", model / "tokenizer.json")
    (model / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}))
    return model


def question_file(tmp_path, categories):
    """One question per category (a second turn for writing) in tmp_path/q.jsonl."""
    qs = tmp_path / "q.jsonl"
    turns = lambda i, c: [f"Question {i} about {c}?"] + (["And a second turn?"] if c == "writing" else [])  # noqa: E731
    qs.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": turns(i, c)}) + "\n"
                          for i, c in enumerate(categories)))
    return qs


def _run(tmp_path, categories, *args) -> tuple[dict, dict]:
    """spec_bench.py on a tiny chat model, one question of each of ``categories``: (its JSON, rows by name)."""
    import spec_bench as b

    model, qs, out = tiny_chat_model(tmp_path), question_file(tmp_path, categories), tmp_path / "sb.json"
    assert b.main(["--model", str(model), "--questions", str(qs), "--per-category", "1", "--threads", "1",
                   *args, "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    return res, {r["name"]: r for r in res["rows"]}


@pytest.mark.slow
def test_every_greedy_row_equals_hf_greedy(tmp_path, capsys):
    import spec_bench as b

    res, rows = _run(tmp_path, ["writing", *b.CATEGORIES[1:]], "--code-count", "1", "--max-new-tokens", "6",
                     "--batch-size", "4", "--temperatures", "0.7")
    greedy = [n for n in rows if "sampling" not in n]
    assert {"HF greedy", "HF prompt lookup", "ours: default (CLI)", "ours: lookahead", "HF batched greedy b=4",
            "ours: default (CLI) b=4"} <= set(greedy)
    assert all(rows[n]["exact"] for n in greedy)
    assert set(rows["HF greedy"]["categories"]) == {*b.CATEGORIES, b.CODE}
    assert res["questions"][:2] == [0, "0-turn2"] and res["turns"] == "all"  # MT-bench's second turn asked after the first
    assert rows["HF greedy"]["speedup_overall"] == 1.0 and rows["ours: lossless sampling T=0.7"]["vs_hf_sampling"] > 0
    assert "ours: default (CLI)" in capsys.readouterr().out


def test_bfloat16_runs_every_row_in_it_and_counts_the_questions_each_equals(tmp_path, capsys):
    import spec_bench as b

    res, rows = _run(tmp_path, b.CATEGORIES[1:], "--code-count", "0", "--max-new-tokens", "5", "--dtype", "bfloat16",
                     "--only", "ours: greedy loop")
    assert res["dtype"] == "bfloat16" and set(rows) == {"HF greedy", "ours: greedy loop"}
    assert rows["ours: greedy loop"]["equal_questions"] == len(res["questions"]) == 5  # one position per call
    assert rows["ours: greedy loop"]["exact"] and "in bfloat16" in capsys.readouterr().out


def test_each_row_is_set_against_its_own_hf_baseline():
    import spec_bench as b

    both = {"vs_prompt_lookup": 1.2, "vs_batched_greedy": 1.5, "vs_hf_sampling": 1.4}
    assert b.against_hf({"name": "ours: default (CLI)", **both}) == 1.2
    assert b.against_hf({"name": "ours: default (CLI) b=4", **both}) == 1.5
    assert b.against_hf({"name": "ours: lossless sampling T=0.7", **both}) == 1.4  # not its prompt-lookup ratio
    assert b.against_hf({"name": "HF sampling T=0.7", "vs_prompt_lookup": 0.9}) is None


def test_a_ratio_whose_passes_disagree_by_more_than_15_percent_is_unsteady():
    import spec_bench as b

    ref = {"tokens_per_s_repeats": [20.0, 20.0, 20.0]}
    row = {"tokens_per_s_repeats": [50.0, 52.0, 49.0]}
    b.steady(row, ref)
    assert row["speedup_spread"] == [2.45, 2.6] and row["unsteady"] is False
    row = {"tokens_per_s_repeats": [50.0, 60.0, 49.0]}
    b.steady(row, ref)
    assert row["unsteady"] is True
    one = {"tokens_per_s_repeats": [50.0]}
    b.steady(one, {"tokens_per_s_repeats": [20.0]})
    assert "unsteady" not in one  # one pass: nothing to compare


def test_the_llama_cpp_rows_run_only_for_smollm2_in_float32(tmp_path, capsys):
    from argparse import Namespace

    import spec_bench as b

    rows = b.llama_cpp_rows(Namespace(llama_cpp="on", model=str(tmp_path), dtype="float32", threads=1))
    assert rows == {} and "skipping the llama.cpp rows" in capsys.readouterr().err
    assert b.llama_cpp_rows(Namespace(llama_cpp="off", model=str(tmp_path), dtype="float32", threads=1)) == {}
