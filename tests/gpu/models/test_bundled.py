"""The bundled defaults in data/ (trained by data/build.sh): they load, fit together, and behave."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.train.data import TokenWindows, encode_files
from latticedraft.gpu.train.evaluate import head_metrics
from latticedraft.gpu.models.hf import check_tokenizer_fits
from latticedraft.lm.corpus import stdlib_split
from latticedraft.lm.tokenizer import fingerprint, load_tokenizer
from latticedraft.paths import data_dir

D = data_dir()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(D / "tokenizer")


@pytest.fixture(scope="module")
def heldout_windows(tok):
    held = encode_files(stdlib_split("heldout"), tok)
    w = TokenWindows(held, 256, 1, source="held-out files").sequential()
    return w[:: max(1, len(w) // 40)][:40]  # 40 windows of 256 tokens spread over the held-out files


def test_tokenizer_is_the_recorded_one(tok):
    meta = json.loads((D / "tokenizer" / "build.json").read_text())
    assert tok.get_vocab_size() == 8192 and fingerprint(tok) == meta["fingerprint"]


@pytest.mark.parametrize("name", ["base", "rescorer-small", "rescorer-medium"])
def test_lms_load_with_auto_class_and_fit_the_tokenizer(name, tok):
    m = AutoModelForCausalLM.from_pretrained(D / name)
    check_tokenizer_fits(tok, m)
    from safetensors import safe_open

    with safe_open(str(D / name / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}  # committed as fp16
    # ... but the config says float32: a plain load is what the CLI runs, not emulated half precision
    from latticedraft.gpu.models.hf import load_causal_lm

    ours = load_causal_lm(D / name).state_dict()
    assert m.dtype == torch.float32 and all(torch.equal(v, ours[k]) for k, v in m.state_dict().items())


@pytest.mark.parametrize("name, width", [("rescorer-small", 64), ("rescorer-medium", 128)])
def test_draft_models_are_the_base_scaled_down_and_distilled_from_it(name, width, heldout_windows):
    from latticedraft.gpu.train.evaluate import follows_base

    base = AutoModelForCausalLM.from_pretrained(D / "base", dtype=torch.float32).eval()
    m = AutoModelForCausalLM.from_pretrained(D / name, dtype=torch.float32).eval()
    assert type(m) is type(base) and (m.config.num_hidden_layers, m.config.hidden_size) == (2, width)
    assert (m.config.vocab_size, m.config.sliding_window, m.config.max_position_embeddings) == (
        base.config.vocab_size, base.config.sliding_window, base.config.max_position_embeddings)
    info = json.loads((D / name / "training.json").read_text())
    assert info["self_distill"]["loss"] == "kl" and info["self_distill"]["text"] == "continuations"
    f = follows_base(m, base, heldout_windows[:8])
    assert f["agreement"] > 0.5, f  # the corpus-trained rescorers agreed with the base on 10-14% of tokens


@pytest.mark.parametrize("name, kind, h", [("heads-stern", "stern", 8), ("heads-dynamo", "dynamo", 3)])
def test_bundled_heads_load_and_head1_is_the_base(name, kind, h, tok):
    bm = BlockwiseModel.from_pretrained(D / name)
    assert (bm.kind, bm.num_heads) == (kind, h)
    base = AutoModelForCausalLM.from_pretrained(D / "base", dtype=torch.float32).eval()
    prompt = json.loads((D / "prompts.jsonl").read_text().splitlines()[0])["prompt"]
    ids = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        out = bm(ids)
        ref = base(input_ids=ids).logits
    assert torch.equal(out.logits, ref) and torch.equal(out.head_logits[..., 0, :], ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["heads-stern", "heads-dynamo"])
def test_heldout_top1_accuracy_falls_with_head_index(name, heldout_windows):
    bm = BlockwiseModel.from_pretrained(D / name)
    m = head_metrics(bm, heldout_windows, batch_size=4)
    acc, ent, agree = np.asarray(m.accuracy), np.asarray(m.entropy), np.asarray(m.agreement)
    # self-distilled: each head agrees with the base's own prediction far more often than with the corpus
    assert json.loads((D / name / "training.json").read_text())["self_distill"]["loss"] == "kl"
    assert agree[0] == 1.0 and np.all(agree[1:] > acc[1:]) and np.all(np.diff(agree) < 0), (agree, acc)
    assert acc[0] > 0.2  # the base learned something: a unigram guess scores under 0.1
    assert np.all(np.diff(acc[:4]) < 0), acc  # near heads: strictly falling
    assert np.all(np.diff(acc) < 0.005), acc  # far heads sit at a ~0.08 floor: falling to within half a point
    # the BPD paper's Figure 2: entropy rises with the head index (far heads: to within 0.02 nats on this sample)
    assert np.all(np.diff(ent[:4]) > 0) and np.all(np.diff(ent) > -0.02), ent
