"""``export custom-generate`` end to end through transformers' own loader
(``model.generate(..., custom_generate=DIR, trust_remote_code=True)``): on a tiny random Llama
saved with the bundled tokenizer and random Stern heads, and on the bundled base with its bundled
heads. Greedy equals ``generate(do_sample=False)`` (left-padded batches, end-of-text lists, every
drafter); sampling repeats under a seed and differs across seeds (top_k=1 is greedy);
``return_dict_in_generate=True`` gives a ``GenerateDecoderOnlyOutput`` with the counts; what it
cannot honour is refused in one line; the export follows the one overwrite rule."""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation import GenerateDecoderOnlyOutput

from latticedraft.cli import main
from latticedraft.errors import LatticedraftError
from latticedraft.paths import data_dir, default_lm_dir
from tests.decoding.tiny import tiny_model
from tests.gpu.conftest import perturb_heads

BASE = data_dir() / "base"
pytestmark = pytest.mark.usefixtures("one_torch_thread")
N = 24


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export") / "latticedraft_generate"
    assert main(["export", "custom-generate", "-o", str(d)]) == 0
    return str(d)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model loaded by from_pretrained, its heads directory): a 2-layer Llama with the bundled
    tokenizer's 8192-token vocabulary (so the bundled n-gram LM fits it) and 4 random Stern heads."""
    from latticedraft.gpu.models.blockwise import BlockwiseModel

    root = tmp_path_factory.mktemp("tiny")
    tiny_model("llama", vocab=8192, seed=3).save_pretrained(root / "model")
    shutil.copy(data_dir() / "tokenizer" / "tokenizer.json", root / "model" / "tokenizer.json")
    model = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    bm = BlockwiseModel.from_base(model, num_heads=4, kind="stern")
    perturb_heads(bm)
    bm.save_pretrained(root / "heads")
    return model, str(root / "heads")


def _ours(model, exported, ids, **kw):
    return model.generate(ids, custom_generate=exported, trust_remote_code=True, **kw)


def _greedy(model, ids, **kw):
    return model.generate(ids, do_sample=False, **kw)


PROMPTS = [[11, 400, 37, 5, 980], [7, 7, 1200, 3]]


@pytest.mark.parametrize("drafter", ["top1", "parallel", "parallel-base", "none"])
def test_greedy_equals_generate_on_a_tiny_model(tiny, exported, drafter):
    model, heads = tiny
    kw = {"drafter": drafter, "tree": "fixed"} | ({} if drafter == "none" else {"heads": heads})
    if drafter == "parallel":
        kw["lm"] = str(default_lm_dir())
    for p in PROMPTS:
        ids = torch.tensor([p])
        out = _ours(model, exported, ids, max_new_tokens=N, **kw)
        assert torch.equal(out, _greedy(model, ids, max_new_tokens=N))


def test_left_padded_batch_with_end_ids_is_padded_like_generate(tiny, exported):
    model, heads = tiny
    refs = [_greedy(model, torch.tensor([p]), max_new_tokens=N)[0, len(p):].tolist() for p in PROMPTS]
    stop = refs[0][5]  # row 0 ends at its 6th new token (or earlier, if it occurs before)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    settings = dict(attention_mask=mask, max_new_tokens=N, eos_token_id=[8191, stop], pad_token_id=1)
    out = _ours(model, exported, ids, heads=heads, tree="fixed", **settings)
    assert torch.equal(out, _greedy(model, ids, **settings))  # transformers' own padded batch
    first = refs[0].index(stop)
    assert out[0, width + first] == stop and (out[0, width + first + 1:] == 1).all()
    assert out.shape[1] > width + first + 1  # row 1 went on: row 0 was padded to it


def test_max_length_and_a_mask_inferred_from_the_pad_id(tiny, exported):
    model, heads = tiny
    ids = torch.tensor([[2, 2] + PROMPTS[1][:2], PROMPTS[0][:4]])  # row 0 left-padded with pad id 2
    out = _ours(model, exported, ids, heads=heads, tree="fixed", max_length=12, pad_token_id=2, eos_token_id=None)
    assert out.shape == (2, 12)
    row0 = _greedy(model, torch.tensor([PROMPTS[1][:2]]), max_new_tokens=8, eos_token_id=None)
    assert out[0, 4:].tolist() == row0[0, 2:].tolist()


def test_sampling_repeats_under_a_seed_and_top_k_1_is_greedy(tiny, exported):
    model, heads = tiny
    ids = torch.tensor([PROMPTS[0]])
    kw = dict(heads=heads, do_sample=True, max_new_tokens=N, temperature=1.5, top_k=0)
    runs = []
    for s in (0, 0, 1):
        torch.manual_seed(s)
        runs.append(_ours(model, exported, ids, **kw))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    torch.manual_seed(5)
    a = _ours(model, exported, ids, seed=7, **kw)
    torch.manual_seed(6)
    assert torch.equal(a, _ours(model, exported, ids, seed=7, **kw))  # seed= decides, not torch's generator
    one = _ours(model, exported, ids, heads=heads, do_sample=True, top_k=1, max_new_tokens=N)
    assert torch.equal(one, _greedy(model, ids, max_new_tokens=N))


def test_return_dict_carries_the_counts(tiny, exported, tmp_path, monkeypatch):
    monkeypatch.setenv("LATTICEDRAFT_CACHE", str(tmp_path))  # --tree auto measures and fits for this tiny model
    model, heads = tiny
    ids = torch.tensor([PROMPTS[0]])
    out = _ours(model, exported, ids, heads=heads, max_new_tokens=N, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, _greedy(model, ids, max_new_tokens=N))
    new = out.sequences.shape[1] - ids.shape[1]
    assert out.calls.shape == (1,) and 1 <= int(out.calls[0]) <= new
    assert float(out.block_efficiency[0]) == pytest.approx(new / int(out.calls[0]))


def test_a_streamer_gets_the_prompt_then_the_new_tokens(tiny, exported):
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.ended = True

    model, heads = tiny
    ids, streamer = torch.tensor([PROMPTS[1]]), Collect()
    out = _ours(model, exported, ids, heads=heads, tree="fixed", max_new_tokens=N, streamer=streamer)
    assert streamer.puts[0] == ids.tolist() and streamer.ended
    assert [t for put in streamer.puts[1:] for t in put] == out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("kw, needle", [
    ({"num_beams": 2}, "generate(num_beams=2)"),
    ({"do_sample": True, "num_return_sequences": 2}, "generate(num_return_sequences=2)"),
    ({"no_repeat_ngram_size": 3}, "generate(no_repeat_ngram_size=3)"),
    ({"stop_strings": ["\n"]}, "generate(stop_strings="),
    ({"output_scores": True}, "generate(output_scores=True)"),
    ({"repetition_penalty": 1.3}, "repetition_penalty=1.3"),
    ({"frobnicate": 1}, "generate(frobnicate=...) is not a setting"),
    ({"drafter": "bogus"}, "drafter 'bogus' is not one of top1"),
    ({"lm": "x", "lm_drafts": 0}, "lm does not apply to drafter top1"),
    ({"lm": "/nowhere"}, "/nowhere not found"),
    ({"seed": 3}, "seed=...) applies to do_sample=True"),
    ({"drafter": "parallel", "nbest": 0}, "nbest 0 must be >= 1"),
    ({"drafter": "none", "heads": "h"}, "heads= does not apply to drafter='none'"),
    ({"heads": None}, "not latticedraft's bundled base"),
    ({"heads": "/nowhere"}, "/nowhere has no heads_config.json"),
    ({"attention_mask": torch.tensor([[1, 1, 0]])}, "attention_mask row 0 is not left padding"),
    ({"max_length": 2, "max_new_tokens": None}, "generate(max_length=2) leaves no room"),
    ({"logits_processor": [object()]}, "generate(logits_processor=...)"),
])
def test_what_it_cannot_honour_is_refused_in_one_line(tiny, exported, kw, needle):
    model, heads = tiny
    kw = {"heads": heads, "max_new_tokens": 4, **kw}
    if kw["heads"] is None:  # no heads on a model that is not the bundled base
        del kw["heads"]
    with pytest.raises(LatticedraftError) as e:
        _ours(model, exported, torch.tensor([[3, 4, 5]]), **kw)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_a_model_without_its_tokenizer_is_refused_naming_where_it_is_read(exported):
    model = tiny_model("llama", vocab=97)  # built in memory: no directory, and the bundled tokenizer does not fit
    with pytest.raises(LatticedraftError, match=r"vocabulary of 97.*built in memory.*tokenizer.save_pretrained"):
        _ours(model, exported, torch.tensor([[3, 4, 5]]), drafter="none", max_new_tokens=4)


def _refused(capsys, argv, needle):
    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], cap.err


def test_the_export_follows_the_overwrite_rule(tmp_path, capsys):
    d = tmp_path / "gen"
    assert main(["export", "custom-generate", "-o", str(d)]) == 0
    assert f"custom_generate={str(d)!r}" in capsys.readouterr().out
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) == [
        "README.md", "custom_generate/generate.py", "custom_generate/requirements.txt", "latticedraft_generate.json"]
    assert (d / "custom_generate" / "requirements.txt").read_text().startswith("latticedraft>=")
    assert json.loads((d / "latticedraft_generate.json").read_text())["format"] == "latticedraft-custom-generate"
    src = (d / "custom_generate" / "generate.py").read_text()
    assert "from latticedraft.decoding.custom_generate.entry import" in src and "from ." not in src
    _refused(capsys, ["export", "custom-generate", "-o", str(d)], "already holds a custom_generate method")
    (d / "custom_generate" / "generate.py").write_text("# edited\n")
    assert main(["export", "custom-generate", "-o", str(d), "--force"]) == 0
    assert (d / "custom_generate" / "generate.py").read_text() == src
    capsys.readouterr()
    other = tmp_path / "model"
    other.mkdir()
    (other / "config.json").write_text("{}")
    _refused(capsys, ["export", "custom-generate", "-o", str(other), "--force"], "holds a model (config.json)")
    assert sorted(p.name for p in other.iterdir()) == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen", "model"]  # no staging directory left


@pytest.mark.slow
@pytest.mark.skipif(not (BASE / "model.safetensors").is_file(), reason="bundled base missing")
def test_the_bundled_base_with_its_defaults_equals_greedy(exported):
    """The issue's check: the bundled base, no keywords (its bundled heads, the CLI's defaults)."""
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(BASE)
    tok = AutoTokenizer.from_pretrained(BASE)
    for text in ("def f(x):", "import os\nimport sys\n\n\nclass Reader(object):\n    def"):
        ids = tok(text, return_tensors="pt").input_ids
        out = _ours(model, exported, ids, max_new_tokens=40, return_dict_in_generate=True)
        assert torch.equal(out.sequences, _greedy(model, ids, max_new_tokens=40))
        assert float(out.block_efficiency[0]) > 1.0  # the bundled heads and context n-grams draft
    torch.manual_seed(0)
    a = _ours(model, exported, ids, max_new_tokens=40, do_sample=True)
    torch.manual_seed(0)
    assert torch.equal(a, _ours(model, exported, ids, max_new_tokens=40, do_sample=True))
