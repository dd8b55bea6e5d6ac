"""``import_gguf`` on a tiny GGUF written here as llama.cpp writes one (``tiny_gguf``): the imported
float32 directory computes exactly the logits (and greedy output) of the model the file was made
from, its tokenizer.json tokenizes like the BPE the file carries, the file's end-of-text and padding
ids land in generation_config.json, the chat template renders, files lying beside the GGUF do not
mix in; and, where ``latticedraft fetch smollm2`` ran, the real SmolLM2-135M-Instruct."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from latticedraft.gpu.models.gguf_import import import_gguf, sha256
from latticedraft.paths import smollm2_dir
from tests.gpu.models.tiny_gguf import BOS, CHAT_TEMPLATE, EOS, PAD, VOCAB, write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = "def add(a, b):\n    return a + b  # héllo, wörld <|im_end|>"
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def f(): pass"}]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(the reference the GGUF was made from, the import's result)."""
    root = tmp_path_factory.mktemp("gguf")
    (root / "src").mkdir()
    ref = write_tiny_gguf(root / "src" / "tiny.gguf")
    return ref, import_gguf(ref.path, root / "out")


def test_the_imported_model_computes_the_reference_logits_and_greedy_output(imported):
    ref, r = imported
    model = AutoModelForCausalLM.from_pretrained(r.out_dir)
    assert model.dtype == torch.float32 and r.dtype == "float32"
    assert r.parameters == sum(p.numel() for p in ref.model.parameters()) == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, VOCAB, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref.model(ids).logits)  # float32 tensors: exact, q/k unpermuted
        kw = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=PAD)
        assert torch.equal(model.generate(ids[:1], **kw), ref.model.generate(ids[:1], **kw))


def test_the_tokenizer_round_trips_and_the_chat_template_renders(imported):
    from tokenizers import Tokenizer

    ref, r = imported
    raw = Tokenizer.from_file(str(r.out_dir / "tokenizer.json"))  # how latticedraft loads tokenizers
    want = ref.tokenizer.encode(TEXT).ids
    assert raw.encode(TEXT).ids == want and raw.decode(want, skip_special_tokens=False) == TEXT
    assert want.count(EOS) == 1  # the special token stays whole
    tok = AutoTokenizer.from_pretrained(r.out_dir)
    assert tok(TEXT).input_ids == want and tok.decode(want) == TEXT
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (EOS, PAD, BOS)
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\ndef f(): pass<|im_end|>\n<|im_start|>assistant\n"


def test_the_files_end_ids_land_in_generation_config_and_the_marker_describes_the_import(imported):
    ref, r = imported
    gen = json.loads((r.out_dir / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["bos_token_id"]) == (EOS, PAD, BOS) and r.eos_token_id == EOS
    cfg = json.loads((r.out_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["model_type"] == "llama"
    meta = json.loads((r.out_dir / "gguf_import.json").read_text())
    assert meta["source"] == {"file": "tiny.gguf", "sha256": sha256(ref.path), "bytes": ref.path.stat().st_size}
    assert (meta["architecture"], meta["model_type"], meta["parameters"]) == ("LlamaForCausalLM", "llama", r.parameters)
    assert {"transformers", "gguf", "latticedraft"} <= set(meta["versions"])
    assert sorted(p.name for p in r.out_dir.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", "gguf_import.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    assert CHAT_TEMPLATE in (r.out_dir / "chat_template.jinja").read_text()


def test_without_a_padding_id_the_end_of_text_id_pads(tmp_path):
    ref = write_tiny_gguf(tmp_path / "nopad.gguf", pad=False)
    r = import_gguf(ref.path, tmp_path / "out")
    gen = json.loads((r.out_dir / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (EOS, EOS)


def test_files_beside_the_gguf_do_not_mix_in(tmp_path):
    ref = write_tiny_gguf(tmp_path / "tiny.gguf")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 50, "n_layer": 1}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer",
                                                                 "chat_template": "not this one"}))
    r = import_gguf(ref.path, tmp_path / "out")
    assert json.loads((r.out_dir / "config.json").read_text())["model_type"] == "llama"
    assert AutoTokenizer.from_pretrained(r.out_dir).chat_template == CHAT_TEMPLATE


@pytest.mark.skipif(not (smollm2_dir() / "gguf_import.json").is_file(),
                    reason="SmolLM2 not fetched (`latticedraft fetch smollm2`)")
def test_the_fetched_smollm2_has_its_end_id_size_and_chat_template():
    from safetensors import safe_open

    d = smollm2_dir()
    meta = json.loads((d / "gguf_import.json").read_text())
    assert meta["source"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and meta["parameters"] == 134_515_008
    with safe_open(str(d / "model.safetensors"), "pt") as f:  # the header only: no 538 MB read
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert sum(torch.Size(s).numel() for s in shapes.values()) == 134_515_008 and dtypes == {"F32"}
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == 2
    tok = AutoTokenizer.from_pretrained(d)
    assert tok.convert_ids_to_tokens(2) == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
