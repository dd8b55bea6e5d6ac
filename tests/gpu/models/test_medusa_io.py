"""Medusa checkpoints in and out: vLLM's layout and FasterDecoding's read into a head directory whose
heads compute Medusa's formula, decode exactly, and export back to the same tensors and config keys;
every malformed or mismatched checkpoint refused in one line, nothing half-written."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.models.medusa_io import export_medusa, import_medusa, read_checkpoint
from tests.gpu.conftest import V, make_tiny, perturb_heads

H = 32


@pytest.fixture
def base_dir(tmp_path):
    make_tiny("llama").save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def vllm_tensors(n=3, L=1, bias=False, original=False, hidden=H, vocab=V, dtype=torch.float16, seed=0, emb=None):
    """Medusa weights under vLLM's names (random, so that every head differs)."""
    g = torch.Generator().manual_seed(seed)
    t = {}
    for i in range(n):
        for l in range(L):
            t[f"blocks.{i}.layers.{l}.weight"] = torch.randn(hidden, hidden, generator=g) * 0.2
            if bias:
                t[f"blocks.{i}.layers.{l}.bias"] = torch.randn(hidden, generator=g) * 0.2
        if not original:
            t[f"lm_heads.{i}.weight"] = torch.randn(vocab, hidden, generator=g)
    if original:
        t["lm_heads.0.weight"] = emb
    return {k: v.to(dtype).contiguous() for k, v in t.items()}


def write_vllm(d, tensors, n=3, L=1, **cfg):
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(d / "model.safetensors"))
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
              "num_heads": n, "num_hidden_layers": L, "max_paths": 64, "topk": 10, "torch_dtype": "float16", **cfg}
    (d / "config.json").write_text(json.dumps(config))
    return d


def medusa_reference(x, blocks, lm):
    """Medusa's formula for one head: z <- z + SiLU(W z + b) per block, logits = lm z (float64)."""
    z = x.double()
    for w, b in blocks:
        z = z + torch.nn.functional.silu(z @ w.double().T + (0 if b is None else b.double()))
    return z @ lm.double().T


def _ids():
    return torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("L,bias", [(1, False), (2, True)])
def test_vllm_layout_imports_computes_medusa_and_exports_the_same_tensors(base_dir, tmp_path, L, bias):
    cfg = {"medusa_fc_bias": True} if bias else {}
    t = vllm_tensors(L=L, bias=bias)
    src = write_vllm(tmp_path / "src", t, L=L, **cfg)
    r = import_medusa(src, base_dir, tmp_path / "heads")
    assert (r.num_heads, r.num_layers, r.lm_head, r.layout, r.dtype) == (3, L, "heads", "vllm", "float16")
    hc = json.loads((tmp_path / "heads" / "heads_config.json").read_text())
    assert hc["kind"] == "medusa" and hc["num_heads"] == 4 and hc["base"] == "../base"
    bm = BlockwiseModel.from_pretrained(tmp_path / "heads")
    ids = _ids()
    with torch.no_grad():
        out = bm(ids)
    for i in range(3):
        blocks = [(t[f"blocks.{i}.layers.{l}.weight"], t.get(f"blocks.{i}.layers.{l}.bias")) for l in range(L)]
        ref = medusa_reference(out.hidden, blocks, t[f"lm_heads.{i}.weight"])
        torch.testing.assert_close(out.head_logits[..., i + 1, :].double(), ref, rtol=1e-4, atol=1e-4)
    r2 = export_medusa(tmp_path / "heads", tmp_path / "out")
    assert r2.dtype == "float16"
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(back) == sorted(t) and all(back[k].dtype == t[k].dtype and torch.equal(back[k], t[k]) for k in t)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == json.loads((src / "config.json").read_text())


def test_original_lm_head_is_tied_to_the_base_and_round_trips(base_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    emb = base.get_output_embeddings().weight.detach()
    t = vllm_tensors(bias=True, original=True, dtype=torch.float32, emb=emb)
    src = write_vllm(tmp_path / "src", t, medusa_fc_bias=True, original_lm_head=True, torch_dtype="float32")
    r = import_medusa(src, base_dir, tmp_path / "heads")
    assert r.lm_head == "tied"
    bm = BlockwiseModel.from_pretrained(tmp_path / "heads")
    ids = _ids()
    with torch.no_grad():
        out = bm(ids)
    ref = medusa_reference(out.hidden, [(t["blocks.2.layers.0.weight"], t["blocks.2.layers.0.bias"])], emb)
    torch.testing.assert_close(out.head_logits[..., 3, :].double(), ref, rtol=1e-4, atol=1e-4)
    export_medusa(tmp_path / "heads", tmp_path / "out")
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(back) == sorted(t) and all(torch.equal(back[k], t[k]) for k in t)
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == json.loads((src / "config.json").read_text())


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_fasterdecoding_naming_imports_and_exports_in_vllm_layout(base_dir, tmp_path, fmt):
    """FasterDecoding: medusa_lm_head.pt holds the ModuleList's own names ({i}.{l}.linear.*, {i}.{L}.weight);
    the .safetensors of its newer trainer prefix them with medusa_head."""
    L, g = 2, torch.Generator().manual_seed(3)
    fd, prefix = {}, "" if fmt == "pt" else "medusa_head."
    for i in range(2):
        for l in range(L):
            fd[f"{prefix}{i}.{l}.linear.weight"] = torch.randn(H, H, generator=g) * 0.2
            fd[f"{prefix}{i}.{l}.linear.bias"] = torch.randn(H, generator=g) * 0.2
        fd[f"{prefix}{i}.{L}.weight"] = torch.randn(V, H, generator=g)
    src = tmp_path / "fd"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": L,
                                                 "base_model_name_or_path": "tiny-llama"}))
    if fmt == "pt":
        torch.save(fd, src / "medusa_lm_head.pt")
    else:
        save_file(fd, str(src / "medusa_lm_head.safetensors"))
    r = import_medusa(src, base_dir, tmp_path / "heads")
    assert (r.num_heads, r.num_layers, r.layout, r.dtype) == (2, L, "fasterdecoding", "float32")
    bm = BlockwiseModel.from_pretrained(tmp_path / "heads")
    with torch.no_grad():
        out = bm(_ids())
    for i in range(2):
        blocks = [(fd[f"{prefix}{i}.{l}.linear.weight"], fd[f"{prefix}{i}.{l}.linear.bias"]) for l in range(L)]
        ref = medusa_reference(out.hidden, blocks, fd[f"{prefix}{i}.{L}.weight"])
        torch.testing.assert_close(out.head_logits[..., i + 1, :].double(), ref, rtol=1e-4, atol=1e-4)
    export_medusa(tmp_path / "heads", tmp_path / "out", dtype="bfloat16")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["num_heads"] == 2 and cfg["num_hidden_layers"] == L and cfg["medusa_fc_bias"] is True
    assert cfg["model_type"] == "medusa" and cfg["base_model_name_or_path"] == "tiny-llama"
    assert not [k for k in cfg if k.startswith("medusa_num")]  # vLLM would read them as num_heads again
    back = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert back["blocks.1.layers.1.bias"].dtype == torch.bfloat16
    assert torch.equal(back["blocks.1.layers.1.bias"], fd[f"{prefix}1.1.linear.bias"].to(torch.bfloat16))
    assert torch.equal(back["lm_heads.0.weight"], fd[f"{prefix}0.{L}.weight"].to(torch.bfloat16))


def test_heads_trained_here_export_for_vllm_and_import_back(base_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    bm = BlockwiseModel.from_base(base, 4, "medusa", medusa_lm_head="tied").eval()
    perturb_heads(bm)
    bm.save_pretrained(tmp_path / "heads")
    export_medusa(tmp_path / "heads", tmp_path / "out")
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg == {"architectures": ["MedusaModel"], "hidden_size": H, "medusa_fc_bias": True, "model_type": "medusa",
                   "num_heads": 3, "num_hidden_layers": 1, "original_lm_head": True, "torch_dtype": "float32",
                   "vocab_size": V}
    import_medusa(tmp_path / "out", base_dir, tmp_path / "again")
    again = BlockwiseModel.from_pretrained(tmp_path / "again")
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(bm(ids).head_logits, again(ids).head_logits)


def test_imported_heads_decode_exactly(base_dir, tmp_path):
    from latticedraft.decoding.methods.bpd_loop import bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
    from tests.decoding.tiny import reference

    import_medusa(write_vllm(tmp_path / "src", vllm_tensors(dtype=torch.float32)), base_dir, tmp_path / "heads")
    bm = BlockwiseModel.from_pretrained(tmp_path / "heads")
    ps = [np.array([5, 9, 2, 77]), np.array([1, 3])]
    refs = [reference(bm, p, 16) for p in ps]
    for name in ("top1", "parallel-base"):
        r = bpd_decode(bm, ps, make_drafter(name, options=LatticeOptions(k=4), nbest=4),
                       request=Request(max_new_tokens=16))
        assert [s.tokens.tolist() for s in r.sequences] == refs


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case,needle",
    [
        ("hidden", "hidden size 48"),
        ("vocab", "vocabulary 101"),
        ("truncated", "truncated_vocab_size 50"),
        ("token_map", "token_map"),
        ("unknown", "'blocks.0.fc.weight'"),
        ("count", "says 4 heads"),
        ("missing", "lacks LM head 1"),
        ("bias_flag", "set medusa_fc_bias to true"),
        ("tied_other", "original_lm_head"),
        ("shape", "LM head 2 has shape (97, 16)"),
    ],
)
def test_bad_checkpoints_refused_and_nothing_written(base_dir, tmp_path, case, needle):
    t, cfg = vllm_tensors(), {}
    if case == "hidden":
        t, cfg = vllm_tensors(hidden=48), {"hidden_size": 48}
    elif case == "vocab":
        t, cfg = vllm_tensors(vocab=101), {"vocab_size": 101}
    elif case == "truncated":
        cfg = {"truncated_vocab_size": 50}
    elif case == "token_map":
        t["token_map"] = torch.arange(50)
    elif case == "unknown":
        t["blocks.0.fc.weight"] = torch.zeros(2)
    elif case == "count":
        cfg = {"num_heads": 4}
    elif case == "missing":
        del t["lm_heads.1.weight"]
    elif case == "bias_flag":
        t = vllm_tensors(bias=True)
    elif case == "tied_other":
        t, cfg = vllm_tensors(original=True, emb=torch.ones(V, H)), {"original_lm_head": True}
    elif case == "shape":
        t["lm_heads.2.weight"] = torch.zeros(V, 16, dtype=torch.float16)
    src = write_vllm(tmp_path / "src", t, **cfg)
    with pytest.raises(ModelError, match=needle.replace("(", r"\(").replace(")", r"\)")) as e:
        import_medusa(src, base_dir, tmp_path / "heads")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "heads").exists() and not list(tmp_path.glob(".heads.*"))


def test_not_a_checkpoint(tmp_path, base_dir):
    with pytest.raises(InputError, match="missing"):
        read_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        read_checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="holds none of model.safetensors"):
        read_checkpoint(tmp_path / "empty")


@pytest.mark.parametrize("kind,needle", [("stern", "Stern FFN heads"), ("dynamo", "DynaMo decoder-layer heads")])
def test_export_refuses_heads_that_are_not_medusa(base_dir, tmp_path, kind, needle):
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    BlockwiseModel.from_base(base, 3, kind).save_pretrained(tmp_path / "heads")
    with pytest.raises(ModelError, match=f"{needle}.*--kind medusa"):
        export_medusa(tmp_path / "heads", tmp_path / "out")
    with pytest.raises(ModelError, match="causal LM without heads.*--kind medusa"):
        export_medusa(base_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()
