"""Kangaroo equals generate(do_sample=False) token for token, for any (l, gamma, eta), batch 1 and 4."""

import copy
import json

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.kangaroo import kangaroo_decode
from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models.adapter import KangarooAdapter, load_adapter, save_adapter
from latticedraft.gpu.models.layer_split import LayerSplit
from tests.decoding.tiny import prompts, reference, tiny_model


def _adapter(model, l, seed=3, noise=0.0):
    a = KangarooAdapter(LayerSplit(model), l)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in a.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise)
    return a.eval()


SLOW = pytest.mark.slow


@pytest.mark.parametrize("arch,l,gamma,eta", [
    ("gpt2", 1, 6, 0.6), ("gpt2", 2, 3, 0.0), pytest.param("gpt2", 3, 1, 0.0, marks=SLOW),
    ("llama", 2, 3, 0.0), ("llama", 3, 1, 0.0), pytest.param("llama", 1, 6, 0.6, marks=SLOW),
    ("mistral", 3, 1, 0.0), ("mistral", 1, 6, 0.6), pytest.param("mistral", 2, 3, 0.0, marks=SLOW),
])
def test_kangaroo_equals_generate(arch, l, gamma, eta):
    m = tiny_model(arch, layers=4, seed=1)
    a = _adapter(m, l)
    ps = prompts(4, seed=l)
    refs = [reference(m, p, 20) for p in ps]
    for batch in ([ps[0]], ps):
        r = kangaroo_decode(m, batch, a, gamma=gamma, eta=eta, max_new_tokens=20)
        for s, ref in zip(r.sequences, refs):
            assert s.tokens.tolist() == ref
            assert sum(s.tokens_per_call) == 20 and s.calls == 1 + len(s.accepted_drafts)


def test_kangaroo_drafts_get_accepted_with_the_model_as_its_own_adapter():
    # eta = 0: always gamma drafts; a 2-layer base whose adapter copies layer 1 drafts well
    m = tiny_model("gpt2", layers=2, seed=4)
    a = _adapter(m, 1)
    p = prompts(1, seed=7)
    r = kangaroo_decode(m, p, a, gamma=4, eta=0.0, max_new_tokens=30, eos_token_id=3)
    assert r.sequences[0].tokens.tolist() == reference(m, p[0], 30, eos=3)
    assert max(r.sequences[0].tree_nodes) == 5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adapter_fits_its_base_cast_to_half_precision(tmp_path, dtype):
    """The sign-bit hash survives rounding: a float32 adapter loads onto its base in half precision;
    a fingerprint stored before the sign hash existed holds only in float32."""
    m = tiny_model("llama", layers=4)
    save_adapter(_adapter(m, 2, noise=0.1), LayerSplit(m), tmp_path / "ad")
    half = copy.deepcopy(m).to(dtype)
    assert load_adapter(tmp_path / "ad", LayerSplit(half)).norm_in.weight.dtype == dtype
    cfg = json.loads((tmp_path / "ad" / "adapter.json").read_text())
    del cfg["base"]["embedding_signs_sha256"]
    (tmp_path / "ad" / "adapter.json").write_text(json.dumps(cfg))
    load_adapter(tmp_path / "ad", LayerSplit(m))
    with pytest.raises(ModelError, match="embedding_sha256"):
        load_adapter(tmp_path / "ad", LayerSplit(half))


def test_adapter_roundtrip_and_mismatch(tmp_path):
    m = tiny_model("llama", layers=4)
    split = LayerSplit(m)
    a = _adapter(m, 2, noise=0.1)
    save_adapter(a, split, tmp_path / "ad")
    b = load_adapter(tmp_path / "ad", split)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    other = LayerSplit(tiny_model("llama", layers=4, seed=9))
    with pytest.raises(ModelError, match="trained for another base .*embedding_signs_sha256"):
        load_adapter(tmp_path / "ad", other)
    wide = LayerSplit(tiny_model("gpt2", layers=4))
    with pytest.raises(ModelError, match="hidden_size|model_type"):
        load_adapter(tmp_path / "ad", wide)
    with pytest.raises(InputError, match="exit-layer 4 must lie in"):
        KangarooAdapter(split, 4)
    cfg = json.loads((tmp_path / "ad" / "adapter.json").read_text())
    assert cfg["exit_layer"] == 2 and cfg["base"]["num_layers"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
def test_adapter_and_exit_heads_distillation_steps_learn(arch):
    from latticedraft.gpu.models.exit_heads import ExitHeads
    from latticedraft.gpu.train.early_exit import adapter_loss, exit_heads_loss

    m = tiny_model(arch, layers=3, seed=5)
    split = LayerSplit(m)
    for p in m.parameters():
        p.requires_grad_(False)
    batch = torch.as_tensor(np.stack(prompts(2, seed=1, lengths=(16,))))
    for module, loss_fn in ((KangarooAdapter(split, 1), adapter_loss), (ExitHeads(split), exit_heads_loss)):
        opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=3e-3)
        with torch.no_grad():
            first = loss_fn(split, module, batch)[0].item()
        for _ in range(8):
            loss, parts = loss_fn(split, module, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            last = loss_fn(split, module, batch)[0].item()
        assert last < first and all(np.isfinite(v) for v in parts.values()), (type(module).__name__, first, last)
