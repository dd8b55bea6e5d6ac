"""``train adapter``, ``train heads --early-exit`` and ``decode --method kangaroo|ppd`` end to end on a
tiny saved 3-layer base: JSON records equal ``generate`` of the base; bad bases, mismatching adapters
and options for another method fail with one line."""

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

from latticedraft.cli import main
from tests.cli.test_decode import TOKENIZER, _greedy

pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]
TRAIN = ["--steps", "2", "--batch-size", "2", "--seq-len", "16", "--checkpoint-every", "1"]


def _base(d, width=16, layers=3, seed=0):
    torch.manual_seed(seed)
    GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=128, n_embd=width, n_layer=layers, n_head=2)).save_pretrained(d)
    (d / "tokenizer.json").write_bytes(TOKENIZER.read_bytes())
    return d


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("selfdraft")
    _base(d / "base")
    (d / "corpus.txt").write_text("def f(x):\n    return x + 1\n" * 40)
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n"
                                             for p in ["def f(x):\n    return", "import os\n", "class A:\n"]))
    assert main(["train", "adapter", "--base", str(d / "base"), "--corpus", str(d / "corpus.txt"), "-o",
                 str(d / "adapter"), "--exit-layer", "1", *TRAIN]) == 0
    assert main(["train", "heads", "--early-exit", "--base", str(d / "base"), "--corpus", str(d / "corpus.txt"), "-o",
                 str(d / "exits"), *TRAIN]) == 0
    return d


@pytest.mark.parametrize("flags,label", [
    (["--method", "kangaroo", "--gamma", "3", "--eta", "0"], "kangaroo gamma=3 eta=0.0"),
    (["--method", "ppd", "--exit-layer", "2", "--candidates", "3"], "ppd exit-layer=2 k=3"),
    (["--method", "ppd", "--exit-layer", "1", "--candidates", "1", "--exit-heads", "EXITS"], "ppd exit-layer=1 k=1"),
])
def test_decode_self_draft_json_matches_generate(tiny, capsys, flags, label):
    flags = [str(tiny / "exits") if f == "EXITS" else f for f in flags]
    extra = ["--adapter", str(tiny / "adapter")] if "kangaroo" in flags else []
    rc = main(["decode", "--model", str(tiny / "base"), "--prompts", str(tiny / "prompts.jsonl"), *flags, *extra,
               "--max-new-tokens", "12", "--json", "--batch-size", "3"])
    out = capsys.readouterr().out
    assert rc == 0
    recs = [json.loads(line) for line in out.strip().splitlines()]
    assert len(recs) == 3
    for r in recs:
        assert r["method"] == label and r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)
        assert sum(r["tokens_per_call"]) == len(r["tokens"])


def test_trained_files_and_reports(tiny):
    rep = json.loads((tiny / "adapter" / "training.json").read_text())
    assert rep["kind"] == "kangaroo-adapter" and rep["steps"] == 2 and set(rep["final_loss"]) == {"loss", "top1"}
    assert json.loads((tiny / "adapter" / "adapter.json").read_text())["exit_layer"] == 1
    assert not (tiny / "adapter" / "checkpoint.pt").exists()
    assert set(json.loads((tiny / "exits" / "training.json").read_text())["final_loss"]) == {"l1", "l2"}


def test_adapter_of_another_width_is_refused_in_one_line(tiny, tmp_path, capsys):
    wide = _base(tmp_path / "wide", width=32)
    rc = main(["decode", "--model", str(wide), "--prompt", "x", "--method", "kangaroo", "--adapter", str(tiny / "adapter")])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err and "hidden_size 16 vs 32" in err and "train adapter" in err


def test_train_adapter_refuses_an_encoder_decoder_in_one_line(tiny, tmp_path, capsys):
    T5ForConditionalGeneration(T5Config(vocab_size=8192, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
                               ).save_pretrained(tmp_path / "t5")
    rc = main(["train", "adapter", "--base", str(tmp_path / "t5"), "--corpus", str(tiny / "corpus.txt"),
               "-o", str(tmp_path / "ad"), *TRAIN])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err and "t5" in err and "causal" in err
    assert not (tmp_path / "ad" / "adapter.json").exists()


def test_train_adapter_refuses_an_exit_layer_beyond_the_base(tiny, tmp_path, capsys):
    rc = main(["train", "adapter", "--base", str(tiny / "base"), "--corpus", str(tiny / "corpus.txt"),
               "-o", str(tmp_path / "ad"), "--exit-layer", "3", *TRAIN])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err and "--exit-layer 3 must lie in [1, 2]" in err


@pytest.mark.parametrize("flags,named", [
    (["--method", "bpd", "--gamma", "3"], "--gamma"),
    (["--method", "kangaroo", "--candidates", "2"], "--candidates"),
    (["--method", "ppd", "--adapter", "x"], "--adapter"),
    (["--method", "kangaroo", "--eta", "1.5"], "--eta"),
    (["--method", "kangaroo", "--gamma", "0"], "--gamma"),
    (["--method", "ppd", "--exit-layer", "0"], "--exit-layer"),
    (["--method", "ppd", "--drafter", "parallel"], "--drafter"),
])
def test_self_draft_options_are_checked_before_loading(tmp_path, capsys, flags, named):
    assert main(["decode", "--model", str(tmp_path / "no-such-model"), "--prompt", "x", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and named in err and "no-such-model" not in err and "\n" not in err


@pytest.mark.parametrize("flags,needle", [
    ([], "train heads needs --heads H"),
    (["--early-exit", "--heads", "3"], "--heads does not apply here"),
    (["--early-exit", "--unfreeze"], "drop --kind and --unfreeze"),
])
def test_train_heads_early_exit_options_are_one_line(tiny, tmp_path, capsys, flags, needle):
    rc = main(["train", "heads", "--base", str(tiny / "base"), "--corpus", str(tiny / "corpus.txt"),
               "-o", str(tmp_path / "h"), *flags, *TRAIN])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and needle in err
