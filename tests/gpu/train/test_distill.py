"""Self-distillation losses (``gpu/train/distill.py``) and ``train_heads`` with them on every architecture."""

import json

import pytest
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.models.hf import backbone, final_norm_name
from latticedraft.gpu.train.continuations import ContinuationSpec
from latticedraft.decoding.runs.continuations import LoopDecoder
from latticedraft.gpu.train.distill import DistillConfig, Teacher, frozen_copy
from latticedraft.gpu.train.heads import head_kl_losses, train_heads
from latticedraft.gpu.train.loop import OptimConfig
from latticedraft.lm.corpus import stdlib_split
from tests.gpu.conftest import V, make_tiny, perturb_heads
from tests.conftest import DISTILL_ARCHS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def sharpen(base, factor: float = 8.0):
    """Scale the base's final norm so that its next-token distributions are peaked (a tiny random
    model's are nearly uniform, which would make every KL term close to 0)."""
    with torch.no_grad():
        getattr(backbone(base), final_norm_name(backbone(base))).weight.mul_(factor)
    return base


def test_teacher_kl_is_the_kl_divergence_and_its_gradient_is_softmax_minus_p():
    g = torch.Generator().manual_seed(0)
    t, s = torch.randn(2, 6, 11, generator=g) * 3, torch.randn(2, 4, 11, generator=g, requires_grad=True)
    teacher = Teacher(t)
    kl = teacher.kl(s, 1, 5)
    p = torch.softmax(t[:, 1:5].double(), -1)
    want = (p * (p.log() - torch.log_softmax(s.double(), -1))).sum(-1).mean()
    assert kl.item() == pytest.approx(want.item(), rel=1e-5)
    kl.backward()
    torch.testing.assert_close(s.grad, ((torch.softmax(s.detach(), -1) - p.float()) / 8), rtol=1e-4, atol=1e-6)
    assert teacher.kl(t[:, 1:5], 1, 5).item() == pytest.approx(0.0, abs=1e-5)  # KL of p to itself
    assert teacher.agreement(t[:, 1:5], 1, 5) == 1.0


@pytest.mark.parametrize("kind", ["stern", "medusa", "dynamo"])
def test_head_j_learns_the_base_distribution_of_token_t_plus_j(kind):
    """Head j at position t is compared with the frozen base's softmax at position t+j-1 (its
    distribution of token t+j given the text up to t+j-1): checked against an explicit loop."""
    base = sharpen(make_tiny("llama"))
    bm = BlockwiseModel.from_base(base, 4, kind)
    perturb_heads(bm)
    batch = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    losses, agree = head_kl_losses(bm, batch)
    with torch.no_grad():
        out = bm(batch)
    p = torch.softmax(out.logits.double(), -1)
    assert losses[0].item() == 0.0 and agree[0] == 1.0
    for j in range(2, 5):
        kls, hits = [], []
        for t in range(12 - j):
            q = torch.log_softmax(out.head_logits[:, t, j - 1].double(), -1)
            pt = p[:, t + j - 1]
            kls.append((pt * (pt.log() - q)).sum(-1))
            hits.append((q.argmax(-1) == pt.argmax(-1)).double())
        assert losses[j - 1].item() == pytest.approx(torch.stack(kls).mean().item(), rel=1e-4), j
        assert agree[j - 1] == pytest.approx(torch.stack(hits).mean().item()), j


@pytest.mark.parametrize("arch", DISTILL_ARCHS)
@pytest.mark.parametrize("kind", ["stern", "medusa", "dynamo"])
def test_a_few_kl_steps_bring_every_head_closer_to_the_base(arch, kind):
    base = sharpen(make_tiny(arch))
    bm = BlockwiseModel.from_base(base, 4, kind)
    for p in base.parameters():
        p.requires_grad_(False)
    batch = torch.randint(0, V, (4, 24), generator=torch.Generator().manual_seed(3))
    opt = torch.optim.AdamW(bm.head_parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    ref = base(input_ids=batch).logits.detach().clone()
    before = [x.item() for x in head_kl_losses(bm, batch)[0]]
    for _ in range(8):
        losses, _ = head_kl_losses(bm, batch)
        opt.zero_grad()
        sum(losses).backward()
        opt.step()
    after = [x.item() for x in head_kl_losses(bm, batch)[0]]
    for j in range(1, 4):
        assert after[j] < 0.9 * before[j], (j, before, after)
    assert torch.equal(base(input_ids=batch).logits, ref)


def test_an_unfrozen_base_is_held_to_a_frozen_copy():
    """With the base training, head 1's term is its KL to the copy made before training: 0 at the start,
    positive once the base moved, and its gradient reaches the base."""
    base = sharpen(make_tiny("mistral"))
    teacher = frozen_copy(base)
    bm = BlockwiseModel.from_base(base, 3, "stern")
    batch = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(2))
    t_logits = teacher(input_ids=batch).logits
    losses, _ = head_kl_losses(bm, batch, t_logits, frozen=False)
    assert losses[0].item() == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        base.model.layers[0].mlp.up_proj.weight.add_(0.5)
    losses, _ = head_kl_losses(bm, batch, t_logits, frozen=False)
    assert losses[0].item() > 1e-4
    losses[0].backward()
    assert base.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    with pytest.raises(InputError, match="frozen teacher"):
        head_kl_losses(bm, batch, None, frozen=False)


def _distill(**kw):
    spec = ContinuationSpec(prompts=8, prompt_len=8, batch_size=4)
    return DistillConfig(continuation=spec, decoder=LoopDecoder, **kw)


@pytest.mark.parametrize("arch", DISTILL_ARCHS)
@pytest.mark.parametrize("kind", ["stern", "medusa", "dynamo"])
def test_train_heads_self_distill_on_every_architecture(saved_bases, own_cache, tmp_path, arch, kind):
    corpus = stdlib_split("heldout")[:3]
    out = tmp_path / "h"
    res = train_heads(saved_bases[arch], corpus, out, 3, kind, OptimConfig(steps=2, batch_size=2, seq_len=24),
                      distill=_distill())
    assert res.finished and set(res.losses) == {"h1", "h2", "h3", "a2", "a3"} and res.losses["h1"] == 0.0
    info = json.loads((out / "training.json").read_text())
    assert info["self_distill"]["text"] == "continuations" and info["self_distill"]["loss"] == "kl"
    assert info["continuation_rows"] == 8 and info["continuation_tokens"] == 8 * 24
    assert info["continuation_greedy_rows"] == 4
    bm = BlockwiseModel.from_pretrained(out)
    assert bm.kind == kind and bm.num_heads == 3


def test_each_part_alone_and_resume(saved_bases, own_cache, tmp_path):
    """(a) continuations with the hard loss and (b) the corpus with the KL loss train on their own; a
    self-distilled run resumes exactly, its continuations read back from the cache."""
    corpus = stdlib_split("heldout")[:3]
    cfg = OptimConfig(steps=4, batch_size=2, seq_len=24, checkpoint_every=2, seed=3)
    hard = train_heads(saved_bases["mistral"], corpus, tmp_path / "hard", 3, "stern", cfg,
                       distill=_distill(loss="hard"))
    assert set(hard.losses) == {"h1", "h2", "h3"} and hard.losses["h1"] > 0  # cross-entropy on the text
    corpus_kl = train_heads(saved_bases["mistral"], corpus, tmp_path / "ckl", 3, "stern", cfg,
                            distill=_distill(text="corpus"))
    assert "a2" in corpus_kl.losses
    assert "continuation_rows" not in json.loads((tmp_path / "ckl" / "training.json").read_text())
    full = train_heads(saved_bases["mistral"], corpus, tmp_path / "full", 3, "stern", cfg, distill=_distill())
    part = train_heads(saved_bases["mistral"], corpus, tmp_path / "part", 3, "stern", cfg, distill=_distill(),
                       stop_after=2)
    assert not part.finished
    rest = train_heads(saved_bases["mistral"], corpus, tmp_path / "part", 3, "stern", cfg, distill=_distill(),
                       resume=True)
    assert rest.resumed_from == 2 and rest.losses == full.losses
    a = BlockwiseModel.from_pretrained(tmp_path / "full").heads.head_state_dict()
    b = BlockwiseModel.from_pretrained(tmp_path / "part").heads.head_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_distill_config_checks():
    with pytest.raises(InputError, match="--distill-loss 'mse'"):
        DistillConfig(loss="mse").validate()
    with pytest.raises(InputError, match="--distill-text 'web'"):
        DistillConfig(text="web").validate()
    with pytest.raises(InputError, match="--seq-len 48 must exceed --prompt-len 48"):
        DistillConfig(continuation=ContinuationSpec(prompt_len=48, seq_len=48)).validate()
    with pytest.raises(InputError, match="--sample-fraction 1.5"):
        DistillConfig(continuation=ContinuationSpec(sample_fraction=1.5)).validate()
    with pytest.raises(TypeError, match="needs decoder="):  # gpu/ knows no decode loop: the caller passes it
        DistillConfig().validate()
    DistillConfig(text="corpus").validate()  # the corpus needs none


def test_held_out_agreement_with_the_base():
    """``head_metrics``' agreement compares head j at t with the base's argmax at t+j-1; ``follows_base``
    of the base itself is KL 0 and agreement 1."""
    import numpy as np

    from latticedraft.gpu.train.evaluate import follows_base, head_metrics

    base = sharpen(make_tiny("gpt2"))
    bm = BlockwiseModel.from_base(base, 3, "stern").eval()  # fresh heads: every head predicts head 1's token
    w = np.random.default_rng(0).integers(0, V, size=(3, 16)).astype(np.int64)
    m = head_metrics(bm, w, batch_size=2)
    with torch.no_grad():
        g = base(input_ids=torch.as_tensor(w)).logits.argmax(-1)
    assert m.agreement[0] == 1.0
    for j in (2, 3):
        want = (g[:, : 16 - j] == g[:, j - 1 : 15]).double().mean().item()
        assert m.agreement[j - 1] == pytest.approx(want)
    same = follows_base(base, base, w, batch_size=2)
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["agreement"] == 1.0
    assert follows_base(make_tiny("gpt2", seed=5), base, w)["kl"] > 0.01
