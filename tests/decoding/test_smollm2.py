"""The real pretrained model, where ``latticedraft fetch smollm2`` has put it (skipped elsewhere, e.g.
in a fresh clone's CI): chat questions through the CLI's default decode, through the greedy loop and
through its self-distilled heads (``data/heads-smollm2``, batch 1 and 2) equal HF ``generate``
greedy on the same token ids, every turn of a two-turn question too (the second asked after
SmolLM2's own answer), and a short answer stops at SmolLM2's own end token ``<|im_end|>`` (id 2),
not at ``<|endoftext|>`` (id 0)."""

from __future__ import annotations

import json

import pytest
import torch

from latticedraft.cli import main
from latticedraft.paths import data_dir, smollm2_dir

pytestmark = [pytest.mark.skipif(not (smollm2_dir() / "gguf_import.json").is_file(),
                                 reason="SmolLM2 not fetched (latticedraft fetch smollm2)"), pytest.mark.slow]
QUESTIONS = [["What is the capital of France?", "And of Italy?"], ["Write a haiku about rain on a tin roof."]]


def test_chat_decodes_equal_hf_greedy_and_stop_at_im_end(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"turns": q}) + "\n" for q in QUESTIONS))
    base = AutoModelForCausalLM.from_pretrained(str(smollm2_dir())).eval()
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    heads = str(data_dir() / "heads-smollm2")
    for model, method in ((str(smollm2_dir()), ["--method", "bpd"]), (str(smollm2_dir()), ["--method", "greedy"]),
                          (heads, ["--method", "bpd"]), (heads, ["--method", "bpd", "--batch-size", "2"])):
        rc = main(["decode", "--model", model, "--prompts", str(prompts), "--chat", "--json",
                   "--max-new-tokens", "24", *method])
        out = capsys.readouterr()
        assert rc == 0, out.err
        recs = [json.loads(x) for x in out.out.strip().splitlines()]
        assert [len(r.get("turns", [r])) for r in recs] == [len(q) for q in QUESTIONS]
        for rec in [t for r in recs for t in r.get("turns", [r])]:  # every turn of every question
            x = torch.tensor([rec["prompt_ids"]])
            with torch.no_grad():
                g = base.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=24)
            want = g[0, x.shape[1]:].tolist()
            assert rec["tokens"] == (want[: want.index(2) + 1] if 2 in want else want), method
        first, second = recs[0]["turns"]
        assert first["tokens"][-1] == 2 and len(first["tokens"]) < 24 and "Paris" in first["text"]
        assert first["text"].strip() in tok.decode(second["prompt_ids"])  # turn 2 follows SmolLM2's own answer
