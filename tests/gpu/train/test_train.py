import json
import math

import numpy as np
import pytest
import torch

from latticedraft.errors import BuildError, InputError, ModelError
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.train.data import TokenWindows
from latticedraft.gpu.train.heads import head_logits, head_losses, head_states, train_heads
from latticedraft.gpu.train.lm import LMArch, train_lm
from latticedraft.gpu.train.loop import OptimConfig, cosine_lr_lambda, run_training
from latticedraft.lm.corpus import stdlib_split
from latticedraft.paths import data_dir
from tests.gpu.conftest import V, make_tiny


def test_a_few_steps_lower_the_loss_of_heads_2_to_h(arch, kind):
    """On a fixed batch, 8 AdamW steps on the heads (base frozen) lower every extra head's loss."""
    base = make_tiny(arch)
    bm = BlockwiseModel.from_base(base, 4, kind)
    batch = torch.randint(0, V, (4, 24), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(bm.head_parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    before = [l.item() for l in head_losses(bm, batch)]
    ref = base(input_ids=batch).logits.detach().clone()
    for _ in range(8):
        losses = head_losses(bm, batch)
        opt.zero_grad()
        sum(losses).backward()
        opt.step()
    after = [l.item() for l in head_losses(bm, batch)]
    assert after[0] == pytest.approx(before[0], abs=1e-6)  # head 1 = frozen base
    for j in range(1, 4):
        assert after[j] < before[j] - 0.05, (j, before, after)
    assert torch.equal(base(input_ids=batch).logits, ref)  # the base did not move


@pytest.mark.parametrize("b", [1, 3])
def test_each_heads_positions_reach_the_projection_as_one_contiguous_block(b):
    """``head_logits`` equals projecting the strided slice of the heads' states, and hands the
    projection one contiguous ``[b * length, 1, H]`` block (a strided view runs as ``b * length``
    single-row products, each reading the whole output embedding)."""
    torch.manual_seed(0)
    bm = BlockwiseModel.from_base(make_tiny("llama"), 4, "stern", seed=0)
    H = bm.base.config.hidden_size
    with torch.no_grad():
        states = bm.heads(torch.randn(b, 9, H))  # [b, 9, 3, H]
        seen, project = [], bm.project_heads
        bm.project_heads = lambda x, **kw: (seen.append(x), project(x, **kw))[1]
        out = head_logits(bm, states, 3, 7, 1.0)
        want = project(states[:, :7, 1:2], first=1)[:, :, 0]
    assert out.shape == want.shape == (b, 7, want.shape[-1]) and torch.allclose(out, want, atol=1e-5)
    assert seen[0].shape == (b * 7, 1, H) and seen[0].is_contiguous()


def test_cosine_schedule_warms_up_then_decays_to_zero():
    f = cosine_lr_lambda(200, 0.01)
    assert f(0) == pytest.approx(0.5) and f(1) == pytest.approx(1.0)
    assert f(101) == pytest.approx(0.5, abs=0.01)
    assert f(200) == pytest.approx(0.0, abs=1e-9)
    assert all(f(s) >= f(s + 1) for s in range(2, 200))


def _windows(n=64, s=8, b=4, seed=0):
    return TokenWindows(np.arange(n * s, dtype=np.int32) % V, s, b, seed)


def test_token_windows_are_deterministic_and_cover_an_epoch():
    w = _windows()
    assert np.array_equal(w.batch(5), _windows().batch(5))
    epoch = np.concatenate([w.batch(i) for i in range(w.batches_per_epoch)])
    assert sorted(map(tuple, epoch)) == sorted(map(tuple, w.windows))


def test_corpus_too_small_for_one_batch():
    with pytest.raises(InputError, match="fewer than one batch of 16"):
        TokenWindows(np.zeros(100, dtype=np.int32), 8, 16, source="corpus x.py")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    lin = torch.nn.Linear(2, 1)

    def loss_fn(batch):
        step = loss_fn.calls
        loss_fn.calls += 1
        loss = lin(torch.ones(1, 2)).sum() ** 2
        return (loss * float("nan") if step == 5 else loss), {"loss": loss.item()}

    loss_fn.calls = 0
    cfg = OptimConfig(steps=10, lr=1e-2, batch_size=4, seq_len=8, checkpoint_every=2)
    with pytest.raises(BuildError, match=r"became nan at step 5; stopped, the last good checkpoint \(step 4\) is kept"):
        run_training(lin, [{"params": list(lin.parameters())}], loss_fn, _windows(), cfg, tmp_path, {"k": 1})
    ck = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert ck["step"] == 4 and all(torch.isfinite(t).all() for t in ck["trainable"].values())


# --- end to end on a tiny base trained here --------------------------------------------------

TOK = data_dir() / "tokenizer"


@pytest.fixture(scope="module")
def corpus():
    return stdlib_split("heldout")[:6]


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("lm") / "base"
    res = train_lm(TOK, corpus, out, LMArch(n_embd=32, n_layer=2, n_head=2, n_positions=64),
                   OptimConfig(steps=3, lr=3e-3, batch_size=4, seq_len=32, checkpoint_every=2))
    assert res.steps == 3 and math.isfinite(res.losses["loss"])
    return out


def test_train_lm_output_loads_with_auto_class(tiny_base):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(tiny_base)
    assert m.config.vocab_size == 8192 and m.config.n_embd == 32
    assert (tiny_base / "tokenizer.json").is_file() and not (tiny_base / "checkpoint.pt").exists()
    info = json.loads((tiny_base / "training.json").read_text())
    assert info["steps"] == 3 and info["tokens_seen"] == 3 * 4 * 32


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_mistral_lm_trains_with_its_sliding_window(corpus, tmp_path, attn):
    """family="mistral": a tied-embedding MistralForCausalLM whose training forward (train mode, no
    cache) already applies the window: changing tokens 0..4 moves no logit past 4 + L·(W-1)."""
    from transformers import AutoModelForCausalLM

    arch = LMArch(n_embd=32, n_layer=2, n_head=4, n_positions=128, family="mistral", sliding_window=8)
    res = train_lm(TOK, corpus, tmp_path / "m", arch, OptimConfig(steps=2, lr=3e-3, batch_size=2, seq_len=48))
    assert res.steps == 2 and math.isfinite(res.losses["loss"])
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "m", attn_implementation=attn).train()
    assert type(m).__name__ == "MistralForCausalLM" and m.config.sliding_window == 8
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()  # tied
    x = torch.randint(0, 8192, (1, 40), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, :5] = (y[0, :5] + 1) % 8192
    moved = (m(input_ids=x).logits - m(input_ids=y).logits).abs().amax(-1)[0] > 0
    reach = 4 + 2 * (8 - 1)  # two layers, each reaching W - 1 positions back
    assert bool(moved[: reach + 1].all()) and not bool(moved[reach + 1:].any())
    with pytest.raises(InputError, match="--sliding-window"):
        train_lm(TOK, corpus, tmp_path / "g", LMArch(n_embd=32, n_layer=1, n_head=2, sliding_window=8),
                 OptimConfig(steps=1, batch_size=2, seq_len=16))


def _heads_cfg(**kw):
    return OptimConfig(**{**dict(steps=4, lr=3e-3, batch_size=4, seq_len=32, checkpoint_every=2, seed=7), **kw})


def _same_heads(a_dir, b_dir):
    a, b = BlockwiseModel.from_pretrained(a_dir), BlockwiseModel.from_pretrained(b_dir)
    sa, sb = a.heads.head_state_dict(), b.heads.head_state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_train_heads_is_deterministic(tiny_base, corpus, tmp_path):
    ra = train_heads(tiny_base, corpus, tmp_path / "a", 3, "stern", _heads_cfg())
    train_heads(tiny_base, corpus, tmp_path / "b", 3, "stern", _heads_cfg())
    train_heads(tiny_base, corpus, tmp_path / "c", 3, "stern", _heads_cfg(seed=8))
    assert _same_heads(tmp_path / "a", tmp_path / "b")
    assert not _same_heads(tmp_path / "a", tmp_path / "c")
    assert ra.losses.keys() == {"h1", "h2", "h3"} and ra.finished
    cfg = json.loads((tmp_path / "a" / "heads_config.json").read_text())
    assert not cfg["base"].startswith("/") and (tmp_path / "a" / cfg["base"]).resolve() == tiny_base.resolve()
    assert not (tmp_path / "a" / "checkpoint.pt").exists()


def test_resume_continues_exactly(tiny_base, corpus, tmp_path):
    train_heads(tiny_base, corpus, tmp_path / "full", 3, "dynamo", _heads_cfg())
    part = train_heads(tiny_base, corpus, tmp_path / "part", 3, "dynamo", _heads_cfg(), stop_after=2)
    assert not part.finished and part.steps == 2
    assert not (tmp_path / "part" / "heads.safetensors").exists()
    rest = train_heads(tiny_base, corpus, tmp_path / "part", 3, "dynamo", _heads_cfg(), resume=True)
    assert rest.resumed_from == 2 and rest.finished
    assert _same_heads(tmp_path / "full", tmp_path / "part")
    full = json.loads((tmp_path / "full" / "training.json").read_text())
    resumed = json.loads((tmp_path / "part" / "training.json").read_text())
    assert resumed["tokens_seen"] == full["tokens_seen"] == rest.tokens  # every slice's tokens, not the last one's
    assert rest.seconds >= part.seconds  # the first slice's time is carried over


def test_resume_from_another_configuration_fails(tiny_base, corpus, tmp_path):
    train_heads(tiny_base, corpus, tmp_path / "h", 3, "stern", _heads_cfg(steps=2), keep_checkpoint=True)
    with pytest.raises(ModelError, match=r"other settings: --heads 3 \(checkpoint\) vs 4 \(now\); --lambdas "):
        train_heads(tiny_base, corpus, tmp_path / "h", 4, "stern", _heads_cfg(steps=2), resume=True)


def test_bad_head_counts(tiny_base, corpus, tmp_path):
    with pytest.raises(InputError, match="at least 2 heads"):
        train_heads(tiny_base, corpus, tmp_path / "h", 1, "stern", _heads_cfg())
    with pytest.raises(InputError, match="--heads 32 must be smaller than --seq-len 32"):
        train_heads(tiny_base, corpus, tmp_path / "h", 32, "stern", _heads_cfg())


def test_tokenizer_vocabulary_mismatch(tiny_base, corpus, tmp_path):
    from latticedraft.lm.tokenizer import train_tokenizer

    small = train_tokenizer(corpus[:2], 400)
    small.save(str(tmp_path / "tok.json"))
    with pytest.raises(ModelError, match="tokenizer has 400 tokens but the base model in .* has a vocabulary of 8192"):
        train_heads(tiny_base, corpus, tmp_path / "h", 3, "stern", _heads_cfg(), tokenizer_path=tmp_path / "tok.json")


def test_corpus_too_small(tiny_base, tmp_path):
    f = tmp_path / "tiny.py"
    f.write_text("x = 1\n")
    with pytest.raises(InputError, match="fewer than one batch"):
        train_heads(tiny_base, [f], tmp_path / "h", 3, "stern", _heads_cfg())


@pytest.mark.parametrize("kind", ["stern", "dynamo"])
def test_unfrozen_three_learning_rates(tiny_base, corpus, tmp_path, kind):
    """LR_MB = 0 with λ_1 = 0: every gradient heads 2..h send into the base (trunk state, shared output
    embedding, DynaMo's shared final norm) is scaled to zero, so the base cannot move; LR_MB > 0 lets it
    move. The updated base is bundled with the heads."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(tiny_base).state_dict()
    for lr_stem, moved in [(0.0, False), (1e-3, True)]:
        out = tmp_path / f"u{lr_stem}"
        train_heads(tiny_base, corpus, out, 3, kind, _heads_cfg(steps=2), lambdas=[0, 1, 1], unfreeze=True,
                    lr_base=1e-3, lr_stem=lr_stem)
        new = AutoModelForCausalLM.from_pretrained(out / "base").state_dict()
        same = all(torch.equal(ref[k], new[k]) for k in ref)
        assert same != moved
        assert json.loads((out / "heads_config.json").read_text())["base"] == "base"


def test_gradient_accumulation_averages_micro_batches(tmp_path):
    """grad_accum=2 over micro-batches i, i+1 gives the same update as one batch made of both."""
    w = _windows(n=64, s=8, b=2)
    w4 = _windows(n=64, s=8, b=4)

    def run(windows, accum, out):
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 1)
        loss_fn = lambda b: ((lin(b.float() / 100.0) ** 2).mean(), {"loss": 0.0})  # noqa: E731
        cfg = OptimConfig(steps=1, lr=1e-2, batch_size=windows.batch_size, seq_len=8, grad_accum=accum)
        res = run_training(lin, [{"params": list(lin.parameters())}], loss_fn, windows, cfg, out, {})
        return lin, res

    a, ra = run(w, 2, tmp_path / "a")
    b, rb = run(w4, 1, tmp_path / "b")
    assert ra.tokens == rb.tokens == 4 * 8
    # the 2+2 windows of micro-batches 0 and 1 are the 4 windows of batch 0 of the same epoch order
    assert np.array_equal(np.concatenate([w.batch(0), w.batch(1)]), w4.batch(0))
    torch.testing.assert_close(a.weight, b.weight)


def test_draft_vocabulary_loss_is_cross_entropy_over_its_columns_alone():
    """With ``draft_vocab`` the extra heads' loss is the cross-entropy over those columns only, averaged
    over the targets inside them; a window with none of its targets inside gives 0, not NaN."""
    torch.manual_seed(0)
    bm = BlockwiseModel.from_base(make_tiny("llama"), 3, "stern", seed=0)
    batch = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    cols = torch.tensor([5, 3, 11, 40, 2, 60, 7, 1, 90, 33])
    batch[:, ::2] = cols[batch[:, ::2] % len(cols)]  # half the targets inside the columns
    got = head_losses(bm, batch, draft_vocab=cols)
    full = head_losses(bm, batch)
    assert got[0].item() == pytest.approx(full[0].item())  # head 1 (the base) keeps the whole vocabulary
    with torch.no_grad():
        _, states, _ = head_states(bm, batch)
        for j in (2, 3):
            logits = head_logits(bm, states, j, 12 - j, 1.0)[..., cols].reshape(-1, len(cols))
            target = batch[:, j:].reshape(-1)
            inside = torch.isin(target, cols)
            index = (target[inside, None] == cols).float().argmax(-1)
            want = torch.nn.functional.cross_entropy(logits[inside], index)
            assert 0 < inside.sum() < len(target) and got[j - 1].item() == pytest.approx(want.item(), rel=1e-5)
    outside = torch.full((1, 12), 4)  # 4 is not a column
    assert [x.item() for x in head_losses(bm, outside, draft_vocab=cols)[1:]] == [0.0, 0.0]
    with pytest.raises(InputError, match="frozen base"):
        head_losses(bm, batch, frozen=False, draft_vocab=cols)


def test_train_heads_with_a_draft_vocabulary_saves_its_ranking(tiny_base, corpus, tmp_path):
    """``draft_vocab=V'`` trains the heads over the V' most frequent tokens of the training text and
    saves that text's ranking beside them, which decoding's ``--draft-vocab`` reads."""
    from latticedraft.gpu.models.draft_vocab import load_ranked, rank_tokens, trained_size
    from latticedraft.gpu.train.data import encode_files
    from latticedraft.lm.tokenizer import load_tokenizer

    res = train_heads(tiny_base, corpus, tmp_path / "h", 3, "stern", _heads_cfg(steps=2), draft_vocab=64)
    assert res.finished and all(math.isfinite(v) for v in res.losses.values())
    stream = encode_files(corpus, load_tokenizer(TOK), "strict")
    ranked = rank_tokens(stream, 8192)
    assert np.array_equal(load_ranked(tmp_path / "h", 64), ranked[:64]) and trained_size(tmp_path / "h") == 64
    assert json.loads((tmp_path / "h" / "training.json").read_text())["draft_vocab"] == 64
    train_heads(tiny_base, corpus, tmp_path / "all", 3, "stern", _heads_cfg(steps=2))
    assert not _same_heads(tmp_path / "h", tmp_path / "all")


@pytest.mark.parametrize("kw, match", [
    (dict(draft_vocab=0), "--draft-vocab 0"),
    (dict(draft_vocab=8, unfreeze=True), "drop --unfreeze"),
    (dict(draft_vocab=8, kind="medusa"), "--medusa-lm-head tied"),
])
def test_draft_vocabulary_refusals(tiny_base, corpus, tmp_path, kw, match):
    kind = kw.pop("kind", "stern")
    with pytest.raises(InputError, match=match):
        train_heads(tiny_base, corpus, tmp_path / "h", 3, kind, _heads_cfg(), **kw)
    assert not (tmp_path / "h").exists()


def test_autocast_runs_the_loss_in_bfloat16_and_keys_the_checkpoint(tiny_base, corpus, tmp_path):
    """``autocast="bfloat16"`` runs each loss under torch.autocast; the weights stay float32, and a
    float32 checkpoint does not resume under it (nor the other way round)."""
    seen = []

    def loss_fn(b):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        return (lin(b.float() / 100.0) ** 2).mean(), {"loss": 0.0}

    lin = torch.nn.Linear(8, 1)
    cfg = OptimConfig(steps=2, lr=1e-2, batch_size=2, seq_len=8, autocast="bfloat16")
    run_training(lin, [{"params": list(lin.parameters())}], loss_fn, _windows(n=64, s=8, b=2), cfg, tmp_path / "l", {})
    assert seen == [True, True] and lin.weight.dtype == torch.float32
    assert "autocast" not in OptimConfig(steps=1).key() and OptimConfig(steps=1, autocast="bfloat16").key()["autocast"]
    with pytest.raises(InputError, match="--autocast float16: use bfloat16"):
        OptimConfig(steps=1, autocast="float16").validate()
    train_heads(tiny_base, corpus, tmp_path / "h", 3, "stern", _heads_cfg(steps=2), keep_checkpoint=True)
    with pytest.raises(ModelError, match="autocast"):
        train_heads(tiny_base, corpus, tmp_path / "h", 3, "stern", _heads_cfg(steps=2, autocast="bfloat16"),
                    resume=True)
