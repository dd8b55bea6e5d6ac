"""``--chat``: prompts go through the model's chat template exactly as
``AutoTokenizer.apply_chat_template(messages, add_generation_prompt=True)`` renders them; chat
records (``messages``, Spec-Bench's ``turns``) decode only with it; a model without a template is
refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from latticedraft.cli import main
from latticedraft.decoding.runs.prompt_set import parse_prompt_set
from latticedraft.paths import data_dir
from tests.contract import refused

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Llama with the bundled tokenizer and a chat template (``chat/``), the same without
    one (``plain/``), and a prompt file of one plain, one ``messages`` and one ``turns`` record."""
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("chat")
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                     eos_token_id=0)).eval()
    for name in ("chat", "plain"):
        m.save_pretrained(d / name)
        shutil.copy(TOKENIZER, d / name / "tokenizer.json")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE, "eos_token": "<|endoftext|>"}
    (d / "chat" / "tokenizer_config.json").write_text(json.dumps(cfg))
    recs = [{"prompt": "Write a loop."},
            {"id": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
            {"question_id": 81, "category": "writing", "turns": ["Compose a haiku.", "Now in French."]}]
    (d / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d, m


def _rendered(d, messages):
    from transformers import AutoTokenizer

    out = AutoTokenizer.from_pretrained(str(d)).apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_chat_records_parse_to_messages():
    text = "\n".join(json.dumps(r) for r in [{"prompt": "a"}, {"messages": [{"role": "user", "content": "b"}]},
                                                  {"turns": ["c", "d"]}])
    ps, _ = parse_prompt_set(text, "t")
    assert [p.messages for p in ps] == [None, [{"role": "user", "content": "b"}], [{"role": "user", "content": "c"}]]
    assert [p.text for p in ps] == ["a", "b", "c"]
    for bad, why in [({"messages": []}, "non-empty list"), ({"messages": [{"role": "user"}]}, "role"),
                     ({"turns": [""]}, "empty prompt"), ({"turns": "x"}, "list of strings")]:
        with pytest.raises(Exception, match=why):
            parse_prompt_set(json.dumps(bad), "t")


def test_decode_chat_uses_the_template_and_equals_generate(chat_model, capsys):
    d, m = chat_model
    rc = main(["decode", "--model", str(d / "chat"), "--prompts", str(d / "chat.jsonl"), "--chat", "--json",
               "--max-new-tokens", "8", "--method", "bpd", "--batch-size", "2"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    recs = [json.loads(x) for x in out.out.strip().splitlines()]
    msgs = [[{"role": "user", "content": "Write a loop."}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            [{"role": "user", "content": "Compose a haiku."}]]
    for rec, ms in zip(recs, msgs):
        ids = _rendered(d / "chat", ms)
        assert rec["prompt_ids"] == ids
        x = torch.tensor([ids])
        g = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=8, pad_token_id=0)
        want = g[0, len(ids):].tolist()
        assert rec["tokens"] == want[: want.index(0) + 1] if 0 in want else want


def test_chat_stream_and_dataset_run(chat_model, capsys, tmp_path):
    d, _ = chat_model
    assert main(["decode", "--model", str(d / "chat"), "--prompt", "Hi", "--chat", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("Hi\n")
    out = tmp_path / "out.jsonl"
    assert main(["decode", "--model", str(d / "chat"), "--prompts", str(d / "chat.jsonl"), "--chat", "--output",
                 str(out), "--max-new-tokens", "4"]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["prompt_ids"] for r in recs][1] == _rendered(d / "chat", [{"role": "system", "content": "Be brief."},
                                                                     {"role": "user", "content": "Hi"}])
    # the same file without --chat would be another run: its settings fingerprint differs
    refused(capsys, ["decode", "--model", str(d / "chat"), "--prompts", str(d / "chat.jsonl"), "--output", str(out),
                     "--max-new-tokens", "4", "--resume"], watch=[tmp_path])


def test_chat_refusals_are_one_line(chat_model, capsys, tmp_path):
    d, _ = chat_model
    refused(capsys, ["decode", "--model", str(d / "chat"), "--prompts", str(d / "chat.jsonl"), "--json"],
            "line 2", "--chat", watch=[tmp_path])
    refused(capsys, ["decode", "--model", str(d / "plain"), "--prompt", "Hi", "--chat"], "no chat template",
            str(d / "plain"), watch=[tmp_path])
    refused(capsys, ["decode", "--model", str(d / "plain"), "--prompts", str(d / "chat.jsonl"), "--chat", "--output",
                     str(tmp_path / "o.jsonl")], "no chat template", watch=[tmp_path])
