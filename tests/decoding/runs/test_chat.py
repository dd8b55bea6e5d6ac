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
                     ({"turns": [""]}, "empty prompt"), ({"turns": ["a", ""]}, "turn 2 is empty"),
                     ({"turns": "x"}, "list of strings")]:
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
        first = rec["turns"][0] if "turns" in rec else rec
        assert first["prompt_ids"] == _rendered(d / "chat", ms)
        assert first["tokens"] == _greedy(m, first["prompt_ids"], 8)


def _greedy(m, ids, n):
    x = torch.tensor([ids])
    g = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0)
    want = g[0, len(ids):].tolist()
    return want[: want.index(0) + 1] if 0 in want else want


def _conversation_checked(d, m, rec, turns, n):
    """rec's turns: each turn's ids are the conversation so far (the model's own answers, as text)
    through the template, and each answer equals HF greedy on them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d / "chat"))
    assert [t["prompt"] for t in rec["turns"]] == turns
    msgs = []
    for turn, t in zip(turns, rec["turns"]):
        msgs.append({"role": "user", "content": turn})
        assert t["prompt_ids"] == _rendered(d / "chat", msgs)
        assert t["tokens"] == _greedy(m, t["prompt_ids"], n)
        msgs.append({"role": "assistant", "content": tok.decode(t["tokens"], skip_special_tokens=True).strip()})
    assert {k: v for k, v in rec.items() if k not in ("turns", "method", "id")} == rec["turns"][-1]  # the last turn


def test_every_turn_is_asked_after_the_models_own_answer(chat_model, capsys, tmp_path):
    """Spec-Bench's ``turns``: --json (batched rounds), a data-set run (one continuous batch) and
    the text stream all decode turn 2 from turn 1's answer, each answer equal to HF greedy."""
    d, m = chat_model
    turns = ["Compose a haiku.", "Now in French.", "Shorter."]
    (tmp_path / "t.jsonl").write_text(json.dumps({"id": "a", "turns": turns}) + "\n"
                                      + json.dumps({"id": "b", "prompt": "Hi"}) + "\n"
                                      + json.dumps({"id": "c", "turns": turns[:2]}) + "\n")
    args = ["decode", "--model", str(d / "chat"), "--prompts", str(tmp_path / "t.jsonl"), "--chat",
            "--max-new-tokens", "6", "--batch-size", "2"]
    assert main([*args, "--json"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    assert [len(r.get("turns", [r])) for r in recs] == [3, 1, 2]
    _conversation_checked(d, m, recs[0], turns, 6)
    _conversation_checked(d, m, recs[2], turns[:2], 6)
    out = tmp_path / "out.jsonl"
    assert main([*args, "--output", str(out)]) == 0
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in got] == ["a", "b", "c"]
    for r, want in zip(got, recs):
        assert r["tokens"] == want["tokens"] and [t["tokens"] for t in r.get("turns", [])] == \
            [t["tokens"] for t in want.get("turns", [])]
    capsys.readouterr()
    assert main(["decode", "--model", str(d / "chat"), "--prompts", str(tmp_path / "t.jsonl"), "--chat",
                 "--max-new-tokens", "6"]) == 0
    text = capsys.readouterr()
    assert [line for line in text.out.splitlines() if line in turns or line == "Hi"] == [*turns, "Hi", *turns[:2]]
    assert text.err.count("-- ") == 6  # one summary line per turn


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


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a model or a transformers tokenizer is loaded: what is refused here is refused
    from the files alone (issue 59, class E)."""
    from latticedraft.decoding.runs import chat, session

    def loaded(*a, **k):
        raise AssertionError("a model or tokenizer was loaded before the refusal")

    monkeypatch.setattr(session, "load_model", loaded)
    monkeypatch.setattr(chat.ChatTemplate, "load", loaded)


MODES = [["--json"], ["--output", "OUT"], []]  # records as JSON, a data-set run, the text stream


@pytest.mark.parametrize("mode", MODES, ids=["json", "output", "stream"])
def test_chat_records_without_chat_and_chat_without_a_template_are_refused_before_loading(
        chat_model, capsys, tmp_path, no_model_load, mode):
    d, _ = chat_model
    mode = [str(tmp_path / "o.jsonl") if m == "OUT" else m for m in mode]
    refused(capsys, ["decode", "--model", str(d / "chat"), "--prompts", str(d / "chat.jsonl"), *mode],
            "line 2 is a chat record", "pass --chat", watch=[tmp_path])
    refused(capsys, ["decode", "--model", str(d / "plain"), "--prompts", str(d / "chat.jsonl"), "--chat", *mode],
            f"--chat: {d / 'plain'} has no chat template", "drop --chat", watch=[tmp_path])
    heads = tmp_path / "heads"  # a head directory: the template is looked for beside its base
    heads.mkdir()
    (heads / "heads_config.json").write_text(json.dumps({"base": "../../" + str((d / "plain").relative_to(d.parent))}))
    refused(capsys, ["decode", "--model", str(heads), "--prompt", "Hi", "--chat"],
            f"{(d / 'plain').resolve()} has no chat template", watch=[tmp_path])


@pytest.mark.parametrize("mode", MODES, ids=["json", "output", "stream"])
def test_every_malformed_chat_record_is_refused_before_loading(chat_model, capsys, tmp_path, no_model_load, mode):
    """Issue 59, class B, through decode: the record's line and the fix, in one line, with no model loaded."""
    from tests.decoding.runs.test_prompt_set import MALFORMED_CHATS

    d, _ = chat_model
    mode = [str(tmp_path / "o.jsonl") if m == "OUT" else m for m in mode]
    for record, why, fix in MALFORMED_CHATS:
        f = tmp_path / "bad.jsonl"
        f.write_text(json.dumps({"prompt": "Hi"}) + "\n" + json.dumps(record) + "\n")
        line = refused(capsys, ["decode", "--model", str(d / "chat"), "--prompts", f, "--chat", *mode],
                       f"--prompts {f} line 2: {why}; {fix}", watch=[tmp_path / "o.jsonl"])
        assert ("--skip-bad" in line) == ("--output" in mode), line  # offered where it applies


def test_an_empty_chat_prompt_is_refused_at_once(chat_model, capsys, no_model_load, monkeypatch):
    import io
    import sys

    d, _ = chat_model
    with pytest.raises(SystemExit):
        main(["decode", "--model", str(d / "chat"), "--chat", "--prompt", ""])
    assert "--prompt: the value is empty" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    refused(capsys, ["decode", "--model", str(d / "chat"), "--chat", "--prompt", "-"], "empty prompt")
