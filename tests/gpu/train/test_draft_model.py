"""Distilled draft models (``gpu/train/draft_model.py``): the base's architecture scaled down, trained
on the base's distribution, usable as the draft model of ``--drafter model``."""

import json

import numpy as np
import pytest
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.train.continuations import ContinuationSpec
from latticedraft.gpu.train.distill import DistillConfig, lm_kl_loss
from latticedraft.gpu.train.draft_model import DraftArch, draft_config, train_draft_model
from latticedraft.gpu.train.loop import OptimConfig
from latticedraft.lm.corpus import stdlib_split
from tests.gpu.conftest import V, make_tiny
from tests.conftest import DISTILL_ARCHS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", DISTILL_ARCHS)
def test_draft_config_scales_the_base_down_and_keeps_the_rest(arch):
    from transformers import AutoModelForCausalLM

    base = make_tiny(arch)
    cfg = draft_config(base.config, DraftArch(n_layer=1, n_embd=16, n_head=2))
    student = AutoModelForCausalLM.from_config(cfg)
    assert type(student) is type(base) and student.config.vocab_size == V
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (16, 1, 2)
    assert student.get_output_embeddings().weight.shape == (V, 16)
    assert base.config.hidden_size == 32 and base.config.num_hidden_layers == 2  # the base's config is untouched
    if arch == "mistral":
        assert cfg.sliding_window == base.config.sliding_window
    if arch in ("llama", "mistral"):  # the base groups 4 query heads per 2 key/value heads: kept, 2 -> 1
        assert cfg.num_key_value_heads == 1 and cfg.head_dim == 8
        assert cfg.intermediate_size == 32  # the base's 2 x hidden, times 16
    ids = torch.randint(0, V, (1, 10))
    assert student(input_ids=ids).logits.shape == (1, 10, V)


def test_draft_arch_checks():
    with pytest.raises(InputError, match="--n-embd 30 is not divisible by --n-head 4"):
        DraftArch(n_embd=30, n_head=4).validate()
    with pytest.raises(InputError, match="--n-layer 0 must be at least 1"):
        DraftArch(n_layer=0).validate()


def test_kl_steps_bring_the_student_to_the_base():
    from transformers import AutoModelForCausalLM

    from tests.gpu.train.test_distill import sharpen

    base = sharpen(make_tiny("mistral"))
    torch.manual_seed(0)
    student = AutoModelForCausalLM.from_config(draft_config(base.config, DraftArch(n_layer=1, n_embd=16, n_head=2)))
    batch = torch.randint(0, V, (4, 16), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    before = lm_kl_loss(student, batch, base)[0].item()
    for _ in range(10):
        loss, _ = lm_kl_loss(student, batch, base)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert lm_kl_loss(student, batch, base)[0].item() < 0.8 * before


def test_train_draft_model_end_to_end(saved_bases, own_cache, tmp_path):
    """A distilled draft model loads with the Auto class, ships the base's tokenizer, and drafts for
    ``--drafter model`` with the output equal to greedy."""
    from latticedraft.decoding.methods.bpd import DrafterSpec
    from latticedraft.decoding.runs.continuations import LoopDecoder
    from latticedraft.decoding.runs.session import Session
    from latticedraft.gpu.models.hf import load_causal_lm

    base_dir, out = saved_bases["mistral"], tmp_path / "draft"
    distill = DistillConfig(continuation=ContinuationSpec(prompts=8, prompt_len=8, batch_size=4), decoder=LoopDecoder)
    res = train_draft_model(base_dir, stdlib_split("heldout")[:3], out, DraftArch(n_layer=1, n_embd=16, n_head=2),
                            OptimConfig(steps=3, batch_size=2, seq_len=24), distill)
    assert res.finished and set(res.losses) == {"kl", "a"}
    m = load_causal_lm(out)
    assert type(m).__name__ == "MistralForCausalLM" and m.config.hidden_size == 16
    assert (out / "tokenizer.json").read_bytes() == (base_dir / "tokenizer.json").read_bytes()
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["num_assistant_tokens"] == 5 and gen["num_assistant_tokens_schedule"] == "heuristic"
    info = json.loads((out / "training.json").read_text())
    assert info["base"] == "../" + base_dir.name or info["base"].endswith(base_dir.name)
    assert info["self_distill"]["loss"] == "kl" and info["continuation_rows"] == 8 and info["parameters"] < info[
        "base_parameters"]
    s = Session(base_dir, draft_model_dir=out, threads=1)
    ids = [np.asarray([5, 9, 11, 300], dtype=np.int64), np.asarray([7, 8], dtype=np.int64)]
    got = s.decode(ids, "bpd", DrafterSpec("model", gamma=3), max_new_tokens=10)
    want = s.decode(ids, "greedy", max_new_tokens=10)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(got.sequences, want.sequences))


@pytest.mark.parametrize("arch", DISTILL_ARCHS)
def test_init_from_base_copies_what_fits(arch):
    """At the base's width: embeddings, final norm and evenly spaced layers (first and last for two);
    narrower: the embeddings projected onto their top principal directions (tied ones stay tied)."""
    from transformers import AutoModelForCausalLM

    from latticedraft.gpu.models import hf
    from latticedraft.gpu.train.draft_model import init_from_base

    base = make_tiny(arch)
    n_head = base.config.num_attention_heads
    same = AutoModelForCausalLM.from_config(draft_config(base.config, DraftArch(n_layer=2, n_embd=32, n_head=n_head)))
    done = init_from_base(same, base)
    bb, sb = hf.backbone(base), hf.backbone(same)
    name = hf.decoder_layers_name(bb, 2)
    for i, j in ((0, 0), (1, 1)):
        a, b = getattr(sb, name)[i].state_dict(), getattr(bb, name)[j].state_dict()
        assert all(torch.equal(a[k], b[k]) for k in b)
    ids = torch.randint(0, V, (1, 9))
    with torch.no_grad():  # two of two layers: the student is the base
        torch.testing.assert_close(same(input_ids=ids).logits, base(input_ids=ids).logits)
    one = AutoModelForCausalLM.from_config(draft_config(base.config, DraftArch(n_layer=1, n_embd=32, n_head=n_head)))
    assert any("<- " in d for d in init_from_base(one, base)) and done
    other = AutoModelForCausalLM.from_config(draft_config(base.config, DraftArch(n_layer=1, n_embd=32, n_head=8)))
    assert not any("<- " in d for d in init_from_base(other, base))  # other attention heads: no layer copied
    narrow = AutoModelForCausalLM.from_config(draft_config(base.config, DraftArch(n_layer=1, n_embd=16, n_head=4)))
    init_from_base(narrow, base)
    E = base.get_input_embeddings().weight
    P = torch.linalg.svd(E, full_matrices=False).Vh[:16].T
    torch.testing.assert_close(narrow.get_input_embeddings().weight, E @ P)
    if base.config.tie_word_embeddings:
        assert narrow.get_output_embeddings().weight.data_ptr() == narrow.get_input_embeddings().weight.data_ptr()
