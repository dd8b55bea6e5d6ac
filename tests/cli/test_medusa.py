"""``import medusa`` / ``export medusa`` end to end on the bundled base: a checkpoint in vLLM's layout
(3 heads, 1 layer) imports, decodes with ``--drafter top1`` exactly as greedy, and exports back to
the same tensors and config; wrong inputs are one ``error:`` line with nothing written."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from latticedraft.cli import main
from latticedraft.paths import data_dir

BASE = data_dir() / "base"
pytestmark = [pytest.mark.skipif(not (BASE / "model.safetensors").is_file(), reason="bundled base missing"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def vllm_ckpt(tmp_path_factory):
    """3 Medusa heads of 1 block for the bundled base, float16, LM heads near the base's output embedding."""
    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    emb = base.get_output_embeddings().weight.detach()
    H, V = emb.shape[1], emb.shape[0]
    g = torch.Generator().manual_seed(0)
    t = {}
    for i in range(3):
        t[f"blocks.{i}.layers.0.weight"] = torch.randn(H, H, generator=g) * 0.05
        t[f"lm_heads.{i}.weight"] = emb + torch.randn(V, H, generator=g) * 0.01
    t = {k: v.to(torch.float16).contiguous() for k, v in t.items()}
    d = tmp_path_factory.mktemp("medusa")
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "medusa", "architectures": ["MedusaModel"],
                                               "hidden_size": H, "vocab_size": V, "num_heads": 3,
                                               "num_hidden_layers": 1, "max_paths": 64, "topk": 10,
                                               "torch_dtype": "float16"}))
    return d, t


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_import_decode_top1_equals_greedy_then_export_round_trips(vllm_ckpt, tmp_path, capsys):
    src, tensors = vllm_ckpt
    assert main(["import", "medusa", str(src), "--base", str(BASE), "-o", str(tmp_path / "heads")]) == 0
    assert "imported 3 Medusa heads (vllm layout" in capsys.readouterr().out
    args = ["--prompt", "import os\nimport sys\n", "--max-new-tokens", "24", "--json"]
    top1 = _json(capsys, ["decode", "--model", str(tmp_path / "heads"), "--drafter", "top1", *args])
    greedy = _json(capsys, ["decode", "--model", str(tmp_path / "heads"), "--method", "greedy", *args])
    assert top1["tokens"] == greedy["tokens"] and len(top1["tokens"]) == 24
    base = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()
    ids = torch.tensor([top1["prompt_ids"]])
    ref = base.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24, pad_token_id=0)
    assert top1["tokens"] == ref[0, ids.shape[1]:].tolist()
    assert main(["export", "medusa", "--model", str(tmp_path / "heads"), "-o", str(tmp_path / "out")]) == 0
    assert "in vLLM's layout" in capsys.readouterr().out
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(back) == sorted(tensors)
    assert all(back[k].dtype == torch.float16 and torch.equal(back[k], tensors[k]) for k in tensors)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == json.loads((src / "config.json").read_text())


def _refused(capsys, argv, needle):
    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], cap.err


def test_one_line_refusals(vllm_ckpt, tmp_path, capsys):
    from tests.gpu.conftest import make_tiny

    src, _ = vllm_ckpt
    make_tiny("llama").save_pretrained(tmp_path / "tiny")
    _refused(capsys, ["import", "medusa", str(src), "--base", str(tmp_path / "tiny"), "-o", str(tmp_path / "h")],
             "hidden size 128 and vocabulary 8192")
    _refused(capsys, ["import", "medusa", str(tmp_path / "nowhere"), "--base", str(BASE), "-o", str(tmp_path / "h")],
             "nowhere is missing")
    assert not (tmp_path / "h").exists()
    _refused(capsys, ["export", "medusa", "--model", str(data_dir() / "heads-stern"), "-o", str(tmp_path / "o")],
             "train heads --kind medusa")
    assert not (tmp_path / "o").exists()


def test_an_original_lm_head_of_another_base_is_one_line(vllm_ckpt, tmp_path, capsys):
    """original_lm_head true with a shared LM head that is not the base's: named with both heads' norms and
    the fix, not a TypeError (SRC as the CLI passes it, a string)."""
    from tests.contract import refused

    src = tmp_path / "tied"
    src.mkdir()
    t = load_file(str(vllm_ckpt[0] / "model.safetensors"))
    V, H = t["lm_heads.0.weight"].shape
    save_file({"blocks.0.layers.0.weight": t["blocks.0.layers.0.weight"], "lm_heads.0.weight": torch.ones(V, H)},
              str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "medusa", "hidden_size": H, "vocab_size": V,
                                                 "num_heads": 1, "num_hidden_layers": 1, "original_lm_head": True}))
    refused(capsys, ["import", "medusa", src, "--base", BASE, "-o", tmp_path / "h"],
            f"{src / 'config.json'} sets original_lm_head true", "lm_heads.0.weight, norm", f"but {BASE} has another "
            "LM head (its output embedding: norm", "import the heads onto the base they were trained for",
            watch=[tmp_path])
