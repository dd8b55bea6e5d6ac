"""The demo's lattice picture: drawn from a pass with a gate of its own, whatever policy the
session's gate has measured its way to."""

import pytest

from latticedraft.decoding.eval.demo import FAST, run_demo
from latticedraft.decoding.planning.head_gate import OFF, HeadGate
from latticedraft.decoding.runs.session import Session
from latticedraft.paths import default_lm_dir
from tests.decoding.tiny import save_bpd_bundle


@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_the_lattice_picture_is_drawn_when_the_sessions_gate_skips_the_heads(tmp_path):
    d = save_bpd_bundle(tmp_path, ["def f(x):\n    return", "import os\n"])
    s = Session(d / "heads", threads=1)
    off = HeadGate()
    off.policy = OFF  # the session's gate: no heads (as a CPU run measures its way to)
    s.learned.swap_gate(FAST, off)
    summary = run_demo(s, prompts_file=d / "prompts.jsonl", num_prompts=2, max_new_tokens=8,
                       out_dir=tmp_path / "demo", notify=lambda *a: None)
    assert summary["all_exact"] and summary["lattice_png"]
    assert (tmp_path / "demo" / "lattice_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert s.learned.gate(FAST) is off  # the session's gate is back in place, untaught by the picture's pass


def test_a_model_without_heads_demos_its_chat_rows_without_a_lattice(tmp_path):
    """The demo on a plain chat model (as ``--model smollm2``): prompts through its chat template, the
    rows that draft from heads left out with a note, every row equal to greedy, no picture."""
    import json
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from latticedraft.paths import data_dir
    from tests.decoding.runs.test_chat import TEMPLATE

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, eos_token_id=0)).eval()
    m.save_pretrained(tmp_path / "chat")
    shutil.copy(data_dir() / "tokenizer" / "tokenizer.json", tmp_path / "chat" / "tokenizer.json")
    (tmp_path / "chat" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}))
    notes = []
    s = Session(tmp_path / "chat", threads=1)
    summary = run_demo(s, prompts_file=data_dir() / "chat-prompts.jsonl", num_prompts=2, max_new_tokens=6,
                       out_dir=tmp_path / "demo", notify=notes.append, chat=True)
    names = [r["name"] for r in summary["rows"]]
    assert names == ["greedy", "prompt lookup (HF)", "context + 4-gram drafts"]
    assert summary["all_exact"] and summary["lattice_png"] is None
    assert any("skipping heads only" in n and "no heads" in n for n in notes)
    assert summary["sample"]["prompt"].startswith("Explain in two sentences")


@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_a_rescorer_made_for_another_vocabulary_leaves_only_its_row_out(tmp_path):
    """Heads on a model with a vocabulary of its own (as SmolLM2's beside the bundled rescorer): the
    neural row is left out with the rescorer's one-line reason, every other row runs."""
    from transformers import GPT2Config, GPT2LMHeadModel

    d = save_bpd_bundle(tmp_path, ["def f(x):\n    return", "import os\n"])
    GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=64, n_embd=8, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "other")
    notes = []
    s = Session(d / "heads", rescorer_dir=tmp_path / "other", threads=1)
    summary = run_demo(s, prompts_file=d / "prompts.jsonl", num_prompts=2, max_new_tokens=6,
                       out_dir=tmp_path / "demo", notify=notes.append)
    names = [r["name"] for r in summary["rows"]]
    assert "neural BPD (paper)" not in names and "latticedraft (default)" in names and len(names) == 7
    assert summary["all_exact"]
    skipped = [n for n in notes if n.strip().startswith("skipping neural BPD")]
    assert len(skipped) == 1 and "vocabulary" in skipped[0] and "\n" not in skipped[0]
