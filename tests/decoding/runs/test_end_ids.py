"""The end of a sequence is the model's, as ``generate`` takes it: ``generation_config.eos_token_id``
(one id or several), not the literal ``<|endoftext|>``. A tiny Llama whose end ids are neither 0 nor
``<|endoftext|>``, decoded by every greedy method through the CLI, stops where ``generate`` stops."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from latticedraft.cli import main
from latticedraft.decoding import registry
from latticedraft.decoding.rows import cut_at_end
from latticedraft.decoding.runs.loaders import end_ids
from latticedraft.lm.tokenizer import load_tokenizer
from latticedraft.paths import data_dir

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
NEW = 12
pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]


def _llama(eos):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=eos)
    m = LlamaForCausalLM(cfg).eval()
    m.config._attn_implementation = "sdpa"
    return m


def _generate(model, prompt):
    """What a user gets: generate(do_sample=False) with the model's own generation config."""
    x = torch.as_tensor(np.asarray(prompt, dtype=np.int64)[None])
    g = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW, pad_token_id=0)
    return cut_at_end(g[0, x.shape[1]:].tolist(), model.generation_config.eos_token_id).tolist()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A tiny Llama whose generation config ends at two ids (neither 0 nor ``<|endoftext|>``), with
    Stern heads naming it, and three prompts: one whose greedy run hits the first end id mid-way,
    one that hits the second, one that runs to the budget."""
    from latticedraft.gpu.models.adapter import KangarooAdapter, save_adapter
    from latticedraft.gpu.models.blockwise import BlockwiseModel
    from latticedraft.gpu.models.layer_split import LayerSplit

    d = tmp_path_factory.mktemp("end-ids")
    tok = load_tokenizer(TOKENIZER)
    texts = ["def f(x):\n    return", "import os\n", "class A:\n    def __init__(self):\n", "for i in range(10):",
             "x = [1, 2, 3]\n", "while True:\n    pass", "print('hello')", "with open(p) as f:"]
    plain = _llama(2)
    conts = [_generate(plain, tok.encode(t).ids)[:NEW] for t in texts]
    endoftext = tok.token_to_id("<|endoftext|>")
    e1 = next(t for t in conts[0][2:-2] if t not in (0, endoftext))
    e2 = next((t for c in conts[1:] for t in c[2:-2] if e1 not in c and t not in (0, endoftext, e1)), None)
    assert e2 is not None, "no second end id found: change the prompts"
    base = _llama([e1, e2])
    base.save_pretrained(d / "base")
    shutil.copy(TOKENIZER, d / "base" / "tokenizer.json")
    bm = BlockwiseModel.from_base(base, 4, seed=0)
    with torch.no_grad():
        for p in bm.heads.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    bm.save_pretrained(d / "heads", base_ref="../base")
    save_adapter(KangarooAdapter(LayerSplit(base), 1).eval(), LayerSplit(base), d / "adapter")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    want = [_generate(base, tok.encode(t).ids) for t in texts]
    assert any(w[-1] == e1 and len(w) < NEW for w in want) and any(w[-1] == e2 and len(w) < NEW for w in want)
    return d, base, (e1, e2), want


def test_end_ids_follow_the_generation_config(bundle):
    d, base, (e1, e2), _ = bundle
    tok = load_tokenizer(TOKENIZER)
    assert end_ids(base, tok) == [e1, e2]
    one = _llama(7)
    assert end_ids(one, tok) == [7]
    none = _llama(None)
    none.generation_config.eos_token_id = None
    assert end_ids(none, tok) == [tok.token_to_id("<|endoftext|>")]  # nothing configured: the tokenizer's


LOSSLESS = [m.name for m in registry.methods().values() if m.lossless and m.sampling != "always"]


@pytest.mark.parametrize("method", LOSSLESS)
def test_every_greedy_method_stops_where_generate_stops(bundle, capsys, method):
    d, _, _, want = bundle
    extra = {"mtad": ["--draft-model", str(d / "base")], "kangaroo": ["--adapter", str(d / "adapter")],
             "ppd": ["--exit-layer", "1"]}.get(method, [])
    for batch in ("1", "4"):
        rc = main(["decode", "--model", str(d / "heads"), "--prompts", str(d / "prompts.jsonl"), "--method", method,
                   *extra, "--max-new-tokens", str(NEW), "--json", "--batch-size", batch])
        out = capsys.readouterr()
        assert rc == 0, out.err
        got = [json.loads(x)["tokens"] for x in out.out.strip().splitlines()]
        assert got == want, (method, batch)
