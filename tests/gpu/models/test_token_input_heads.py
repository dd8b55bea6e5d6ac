"""Stern heads with token input (EAGLE's token input): each head also reads the embedding of the
token after the position (the text's in training, the emitted one in decoding). The formula, every code path agreeing on that token, checkpoints, and
decoding with them staying exactly greedy."""

import numpy as np
import pytest
import torch
from torch import nn

from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models.blockwise import BlockwiseModel
from latticedraft.gpu.models.heads import SternHeads
from tests.gpu.conftest import V, make_tiny, perturb_heads

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _token_heads(arch="llama", num_heads=4):
    bm = BlockwiseModel.from_base(make_tiny(arch), num_heads, "stern", token_input=True).eval()
    perturb_heads(bm)
    return bm


def test_each_head_adds_the_next_tokens_embedding_to_its_hidden_layer():
    bm = _token_heads()
    m, base = bm.heads, bm.base
    x = torch.randn(3, 32)
    y = torch.tensor([5, 0, 17])
    got = m(x, next_tokens=y)
    e = base.get_input_embeddings()(y)
    for j in range(m.num_extra):
        z = nn.functional.linear(x, m.w1[j], m.b1[j]) + nn.functional.linear(e, m.u1[j])
        torch.testing.assert_close(got[:, j], x + nn.functional.linear(m.act(z), m.w2[j], m.b2[j]))
    greedy = base.get_output_embeddings()(x).argmax(-1)
    torch.testing.assert_close(m(x), m(x, next_tokens=greedy))  # default: the base's greedy token
    assert not torch.allclose(m(x, next_tokens=(greedy + 1) % V), m(x))  # the token matters


@pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral"])
def test_the_forward_the_positions_and_the_lazy_verifier_path_agree(arch):
    bm = _token_heads(arch)
    ids = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = bm(ids).head_logits
        out = bm(ids, heads=False)
        at = bm.head_logits_from(out, [0, 4, 9])
        states = bm.heads(out.hidden[:, [0, 4, 9]])  # the verifier's lazy call: no token given
    torch.testing.assert_close(at, full[:, [0, 4, 9]])
    torch.testing.assert_close(bm.unembed(states), full[:, [0, 4, 9], 1:])


def test_save_load_round_trip_and_refusals(tmp_path):
    base = make_tiny("mistral")
    base.save_pretrained(tmp_path / "base")
    from transformers import AutoModelForCausalLM

    bm = BlockwiseModel.from_base(AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval(), 3, "stern",
                                  token_input=True).eval()
    perturb_heads(bm)
    bm.save_pretrained(tmp_path / "h")
    loaded = BlockwiseModel.from_pretrained(tmp_path / "h")
    assert loaded.heads.token_input and "heads.1.fc1_token.weight" in loaded.heads.head_state_dict()
    ids = torch.randint(0, V, (1, 9))
    with torch.no_grad():
        assert torch.equal(bm(ids).head_logits, loaded(ids).head_logits)
    with pytest.raises(InputError, match="--token-input is a Stern head option"):
        BlockwiseModel.from_base(make_tiny("llama"), 3, "dynamo", token_input=True)
    with pytest.raises(ModelError, match="attach"):
        SternHeads(8, 2, 16, token_input=True)(torch.randn(2, 8))


@pytest.mark.parametrize("name", ["top1", "parallel-base"])
def test_decoding_with_token_input_heads_equals_greedy(name):
    from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
    from tests.decoding.tiny import prompts, reference

    bm = _token_heads("gpt2", num_heads=5)
    ps = prompts(3, seed=2, vocab=V)
    refs = [reference(bm, p, 20) for p in ps]
    for vocab in (None, np.arange(0, V, 2)):
        r = bpd_decode(
            bm,
            ps,
            make_drafter(name, options=LatticeOptions(k=4), nbest=4),
            BpdPlan(draft_vocab=vocab),
            Request(max_new_tokens=20),
        )
        assert [s.tokens.tolist() for s in r.sequences] == refs


def test_training_token_input_heads_runs_the_losses():
    from latticedraft.gpu.train.heads import head_kl_losses, head_losses

    bm = _token_heads("gpt2", num_heads=3)
    for p in bm.base.parameters():
        p.requires_grad_(False)
    batch = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(4))
    for losses in (head_losses(bm, batch), head_kl_losses(bm, batch)[0]):
        sum(losses).backward()
    assert bm.heads.u1.grad is not None and bm.heads.u1.grad.abs().sum() > 0
    assert bm.base.get_input_embeddings().weight.grad is None


def test_draft_logits_take_the_greedy_token_the_verifier_already_has():
    """Passing the base's greedy token after each state (the walk's bonus token) gives the logits the
    heads compute by projecting it themselves; another token gives other logits."""
    bm = _token_heads("mistral", num_heads=4)
    h = torch.randn(3, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        greedy = bm.base.get_output_embeddings()(h).argmax(-1)
        own = bm.draft_logits(h, 3)
        assert torch.equal(bm.draft_logits(h, 3, next_tokens=greedy), own)
        assert not torch.equal(bm.draft_logits(h, 3, next_tokens=(greedy + 1) % V), own)


def test_training_reads_the_texts_next_token_not_the_greedy_one():
    """Teacher forcing: on sampled text the next token is not the base's argmax, and the heads must
    learn the continuation of the text they are shown (decoding feeds the token it emitted)."""
    from latticedraft.gpu.train.heads import head_states

    bm = _token_heads("llama", num_heads=3)
    batch = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out, states, _ = head_states(bm, batch)
        feed = out.hidden_states[-1]
        want = bm.heads(feed[:, :-1], next_tokens=batch[:, 1:])
        greedy = bm.heads(feed[:, :-1])
    torch.testing.assert_close(states[:, :-1], want)
    assert not torch.allclose(states[:, :-1], greedy)  # the random text is not the base's greedy text


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_sampling_feeds_the_heads_the_drawn_token(arch):
    """Lossless sampling: the heads that draft the next step read the token the step emitted (the
    drawn bonus), at the prefill and at every step, also where it is not the argmax."""
    from latticedraft.decoding.accept.sampling import SamplingOptions
    from latticedraft.decoding.methods.bpd_loop import bpd_decode
    from latticedraft.decoding.registry import Request
    from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
    from tests.decoding.tiny import prompts

    bm = _token_heads(arch, num_heads=4)
    seen, emitted = [], []
    draft_logits = bm.draft_logits

    def spy(hidden, count, columns=None, next_tokens=None):
        greedy = bm.base.get_output_embeddings()(hidden).argmax(-1)
        seen.append((next_tokens.tolist(), greedy.tolist(), len(emitted)))
        return draft_logits(hidden, count, columns, next_tokens)

    bm.draft_logits = spy
    r = bpd_decode(
        bm,
        prompts(1, seed=3, vocab=V),
        make_drafter("top1", options=LatticeOptions(k=8)),
        request=Request(
            max_new_tokens=24,
            sampling=SamplingOptions(temperature=1.5, top_k=0, seed=1),
            on_tokens=lambda i, toks: emitted.extend(int(t) for t in toks),
        ),
    )
    out = r.sequences[0].tokens.tolist()
    assert len(seen) >= 2
    # a step's heads run before its tokens are emitted: they read the last token that step emits
    ends = [n for _, _, n in seen[1:]] + [len(out)]
    assert [tok for (tok,), _, _ in seen] == [out[e - 1] for e in ends]
    assert any(tok != g for (tok,), (g,), _ in seen)  # drawn tokens that are not the argmax were fed
