import pytest
import torch
from transformers import AutoModelForCausalLM

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf
from latticedraft.gpu.models.blockwise import BlockwiseCache, BlockwiseModel
from tests.gpu.conftest import V, make_tiny, perturb_heads


@pytest.fixture
def ids():
    return torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))


def test_head1_is_the_base_model_exactly(arch, kind, ids):
    base = make_tiny(arch)
    bm = BlockwiseModel.from_base(base, 4, kind).eval()
    perturb_heads(bm)
    with torch.no_grad():
        ref = base(input_ids=ids).logits
        out = bm(ids)
    assert torch.equal(out.logits, ref)
    assert out.head_logits.shape == (2, 12, 4, V)
    assert torch.equal(out.head_logits[..., 0, :], ref)
    assert not torch.allclose(out.head_logits[..., 1, :], ref)  # the extra heads really differ
    # and the base is untouched: same logits as a fresh copy of the same seed
    assert torch.equal(make_tiny(arch)(input_ids=ids).logits, ref)


def test_fresh_heads_start_from_head1(arch, kind, ids):
    """Stern FFNs start with a zero output layer; DynaMo layers are copies of the final layer."""
    base = make_tiny(arch)
    bm = BlockwiseModel.from_base(base, 3, kind).eval()
    with torch.no_grad():
        out = bm(ids)
    for j in range(3):
        torch.testing.assert_close(out.head_logits[..., j, :], out.logits, rtol=1e-5, atol=1e-5)


def test_save_load_round_trip_identical(arch, kind, ids, tmp_path):
    base = make_tiny(arch)
    base.save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    bm = BlockwiseModel.from_base(base, 3, kind).eval()
    perturb_heads(bm)
    bm.save_pretrained(tmp_path / "heads")
    cfg = (tmp_path / "heads" / "heads_config.json").read_text()
    assert '"base": "../base"' in cfg
    loaded = BlockwiseModel.from_pretrained(tmp_path / "heads")
    with torch.no_grad():
        a, b = bm(ids), loaded(ids)
    assert torch.equal(a.head_logits, b.head_logits)
    assert loaded.kind == kind and loaded.num_heads == 3


def test_save_bundles_a_base_without_directory(ids, tmp_path):
    bm = BlockwiseModel.from_base(make_tiny("llama"), 3, "stern").eval()
    perturb_heads(bm)
    bm.save_pretrained(tmp_path / "h")
    assert (tmp_path / "h" / "base" / "config.json").is_file()
    loaded = BlockwiseModel.from_pretrained(tmp_path / "h")
    with torch.no_grad():
        assert torch.equal(bm(ids).head_logits, loaded(ids).head_logits)


def test_incremental_cache_matches_full_forward(arch, kind, ids):
    bm = BlockwiseModel.from_base(make_tiny(arch), 3, kind).eval()
    perturb_heads(bm)
    with torch.no_grad():
        full = bm(ids)
        o1 = bm(ids[:, :7], use_cache=True)
        if kind == "dynamo":
            assert isinstance(o1.cache, BlockwiseCache)
        # heads=False still advances dynamo head caches
        o2 = bm(ids[:, 7:9], cache=o1.cache, use_cache=True, heads=False)
        assert o2.head_logits is None
        o3 = bm(ids[:, 9:], cache=o2.cache, use_cache=True)
    torch.testing.assert_close(o3.head_logits, full.head_logits[:, 9:], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(bm.head_logits_from(o2, [1]), full.head_logits[:, 8:9], rtol=1e-4, atol=1e-5)


def test_cache_crop_then_continue(kind, ids):
    """Rolling back rejected positions (crop) and re-feeding gives the full-forward result."""
    bm = BlockwiseModel.from_base(make_tiny("llama"), 3, kind).eval()
    perturb_heads(bm)
    with torch.no_grad():
        full = bm(ids)
        o1 = bm(ids[:, :10], use_cache=True)
        o1.cache.crop(-4)  # keep 6
        assert o1.cache.get_seq_length() == 6
        o2 = bm(ids[:, 6:], cache=o1.cache, use_cache=True)
    torch.testing.assert_close(o2.head_logits, full.head_logits[:, 6:], rtol=1e-4, atol=1e-5)


def test_4d_tree_mask_passes_through(arch, kind, ids):
    """A 4-D additive mask with two branches sharing a prefix gives each branch its own logits."""
    bm = BlockwiseModel.from_base(make_tiny(arch), 3, kind).eval()
    perturb_heads(bm)
    prefix, a, b = ids[:1, :6], ids[:1, 6:8], ids[:1, 8:10]
    seq = torch.cat([prefix, a, b], 1)  # tree: prefix -> a0 -> a1 ; prefix -> b0 -> b1
    n = seq.shape[1]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            allowed[i, j] = j <= i and (i < 6 or j < 6 or (i < 8) == (j < 8))
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 6, 7]])
    with torch.no_grad():
        tree = bm(seq, attention_mask=mask, position_ids=pos)
        ra = bm(torch.cat([prefix, a], 1))
        rb = bm(torch.cat([prefix, b], 1))
    torch.testing.assert_close(tree.head_logits[:, :8], ra.head_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tree.head_logits[:, 8:], rb.head_logits[:, 6:], rtol=1e-4, atol=1e-5)


def test_head_logits_from_positions(kind, ids):
    bm = BlockwiseModel.from_base(make_tiny("gpt2"), 4, kind).eval()
    perturb_heads(bm)
    with torch.no_grad():
        out = bm(ids, heads=(kind == "dynamo"))
        got = bm.head_logits_from(out, [0, 5, 11])
        ref = bm(ids).head_logits[:, [0, 5, 11]]
    assert got.shape == (2, 3, 4, V)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("h", [1, 0, -2])
def test_fewer_than_two_heads_rejected(h):
    with pytest.raises(InputError, match="at least 2 heads"):
        BlockwiseModel.from_base(make_tiny("gpt2"), h, "stern")


def test_unknown_kind_rejected():
    with pytest.raises(InputError, match="stern, medusa or dynamo"):
        BlockwiseModel.from_base(make_tiny("gpt2"), 3, "hydra")


@pytest.mark.parametrize("other", [dict(hidden=48), dict(vocab=101)])
def test_loading_onto_another_base_fails_clearly(other, tmp_path):
    bm = BlockwiseModel.from_base(make_tiny("llama"), 3, "stern")
    bm.save_pretrained(tmp_path / "h")
    with pytest.raises(ModelError, match="hidden size 32 and vocabulary 97"):
        BlockwiseModel.from_pretrained(tmp_path / "h", base=make_tiny("llama", **other))


def test_loading_onto_another_architecture_fails(tmp_path):
    bm = BlockwiseModel.from_base(make_tiny("llama"), 3, "dynamo")
    bm.save_pretrained(tmp_path / "h")
    with pytest.raises(ModelError, match="llama base, not gpt2"):
        BlockwiseModel.from_pretrained(tmp_path / "h", base=make_tiny("gpt2"))


def test_base_dir_without_weights_or_config(tmp_path):
    base = make_tiny("gpt2")
    base.save_pretrained(tmp_path / "base")
    bm = BlockwiseModel.from_base(base, 3, "stern")
    bm.save_pretrained(tmp_path / "h", base_ref="../base")
    (tmp_path / "base" / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no weights"):
        BlockwiseModel.from_pretrained(tmp_path / "h")
    (tmp_path / "base" / "config.json").unlink()
    with pytest.raises(ModelError, match="has no config.json"):
        BlockwiseModel.from_pretrained(tmp_path / "h")


def test_not_a_head_checkpoint(tmp_path):
    with pytest.raises(ModelError, match="not a head checkpoint"):
        BlockwiseModel.from_pretrained(tmp_path)


def test_dynamo_rejects_bare_base_cache(ids):
    bm = BlockwiseModel.from_base(make_tiny("llama"), 3, "dynamo").eval()
    with torch.no_grad():
        out = bm.base(input_ids=ids, use_cache=True)
        with pytest.raises(InputError, match="BlockwiseCache"):
            bm(ids[:, :1], cache=hf.output_cache(out), use_cache=True)


def test_new_cache_is_filled_in_place(kind, ids):
    """A cache from ``new_cache()`` is the object the model fills (callers may keep a reference to it)."""
    bm = BlockwiseModel.from_base(make_tiny("neox"), 3, kind).eval()
    perturb_heads(bm)
    cache = bm.new_cache()
    with torch.no_grad():
        full = bm(ids)
        o1 = bm(ids[:, :5], cache=cache, use_cache=True)
        o2 = bm(ids[:, 5:], cache=cache, use_cache=True)
    assert cache.get_seq_length() == 12
    if kind == "dynamo":
        assert o1.cache.base is cache.base and len(cache.layers) == 2 + 2 * 1
    torch.testing.assert_close(o2.head_logits, full.head_logits[:, 5:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch_name", ["gpt2", "llama"])
def test_left_padding_with_2d_mask(arch_name, kind, ids):
    """A left-padded row (2-D mask, explicit positions) gets the same head logits as the row alone."""
    bm = BlockwiseModel.from_base(make_tiny(arch_name), 3, kind).eval()
    perturb_heads(bm)
    short = ids[1, :7]
    batch = torch.stack([ids[0, :10], torch.cat([torch.zeros(3, dtype=torch.long), short])])
    mask = torch.tensor([[1] * 10, [0] * 3 + [1] * 7])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded = bm(batch, attention_mask=mask, position_ids=pos)
        alone = bm(short[None])
    torch.testing.assert_close(padded.head_logits[1, 3:], alone.head_logits[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind,lm_head", [("stern", None), ("medusa", "heads"), ("medusa", "tied")])
def test_draft_logits_equal_the_forward_heads_and_project_onto_columns(kind, lm_head, ids):
    """``draft_logits`` at stored final hidden states = the forward's heads 2..count+1, and with
    ``columns`` exactly those vocabulary entries (the lazy verifier path and the draft vocabulary)."""
    kw = {} if lm_head is None else dict(medusa_lm_head=lm_head, medusa_layers=2)
    bm = BlockwiseModel.from_base(make_tiny("llama"), 4, kind, **kw).eval()
    perturb_heads(bm)
    assert bm.position_wise
    cols = torch.tensor([3, 0, 17, 96, 40])
    with torch.no_grad():
        out = bm(ids)
        hid = out.hidden.reshape(-1, out.hidden.shape[-1])
        full = out.head_logits.reshape(-1, 4, V)
        torch.testing.assert_close(bm.draft_logits(hid, 3), full[:, 1:], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bm.draft_logits(hid, 2), full[:, 1:3], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bm.draft_logits(hid, 3, cols), full[:, 1:, cols], rtol=1e-5, atol=1e-6)
        assert bm.draft_logits(hid, 0, cols).shape == (hid.shape[0], 0, 5)
        proj = bm.heads.lm if lm_head == "heads" else bm.base.get_output_embeddings().weight
        proj.mul_(-1.5)  # a changed projection is seen: the column cache follows the weights (training)
        torch.testing.assert_close(bm.draft_logits(hid, 3, cols), bm.draft_logits(hid, 3)[..., cols], rtol=1e-5, atol=1e-6)


def test_draft_logits_refuses_dynamo(ids):
    bm = BlockwiseModel.from_base(make_tiny("gpt2"), 3, "dynamo").eval()
    assert not bm.position_wise
    with pytest.raises(ModelError, match="position-wise"):
        bm.draft_logits(torch.zeros(2, 32), 2)


def test_medusa_config_round_trip(ids, tmp_path):
    base = make_tiny("gpt2")
    base.save_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    bm = BlockwiseModel.from_base(base, 3, "medusa", medusa_layers=2, medusa_lm_head="tied", medusa_fc_bias=False,
                                  logit_scale=0.5).eval()
    perturb_heads(bm)
    bm.save_pretrained(tmp_path / "heads")
    loaded = BlockwiseModel.from_pretrained(tmp_path / "heads")
    h = loaded.heads
    assert (h.num_layers, h.lm_head, h.fc_bias, h.logit_scale) == (2, "tied", False, 0.5)
    with torch.no_grad():
        assert torch.equal(bm(ids).head_logits, loaded(ids).head_logits)
        plain = BlockwiseModel.from_base(base, 3, "medusa", medusa_layers=2, medusa_lm_head="tied", medusa_fc_bias=False)
        plain.heads.load_state_dict(bm.heads.state_dict())
        torch.testing.assert_close(bm(ids).head_logits[..., 1:, :], 0.5 * plain(ids).head_logits[..., 1:, :])
