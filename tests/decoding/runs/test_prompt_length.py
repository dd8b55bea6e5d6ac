"""Long prompts: every decoder over the rolling-buffer cache with chunked prefill equals
``model.generate(do_sample=False)`` on tiny random Mistral models (sliding windows 8 and 12,
prompts of 3 windows and more), batch 1 and 4; prompts past the model's positions are refused
in one line naming ``--truncate-left``, which keeps the last N tokens."""

import functools

import numpy as np
import pytest
import torch

from latticedraft.cli import main
from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.decoding.methods.greedy import greedy_decode
from latticedraft.decoding.proposers.context import ContextNgrams, ContextProposer
from latticedraft.decoding.proposers.heads import LatticeOptions, make_drafter
from latticedraft.decoding.methods.lookahead import LookaheadOptions, lookahead_decode
from latticedraft.decoding.runs.prompt_length import check_fits, truncate_left
from latticedraft.errors import InputError
from latticedraft.paths import data_dir
from tests.decoding.tiny import blockwise, prompts, reference, save_bpd_bundle, tiny_model
from tests.lattice.toylm import make_toy_lm

MAX_NEW = 20
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@functools.lru_cache(maxsize=None)
def _case(window: int, batch: int):
    """(BlockwiseModel with sliding ``window``, prompts of >= 3 windows, generate's tokens)."""
    model = blockwise("mistral", torch.float32, num_heads=4, seed=3, window=window)
    ps = prompts(batch, seed=window, lengths=(3 * window, 3 * window + 5, 4 * window - 1, 3 * window + 2))
    return model, ps, [reference(model, p, MAX_NEW) for p in ps]


@pytest.fixture(scope="module")
def toy_lm():
    return make_toy_lm(V=64, order=3, seed=0, density=0.5)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("name", ["top1", "neural", "ngram", "parallel", "parallel-base", "oracle"])
def test_every_drafter_over_the_rolling_cache_equals_generate(name, batch, toy_lm):
    window = 8 if batch == 4 else 12
    model, ps, refs = _case(window, batch)
    d = make_drafter(name, options=LatticeOptions(k=8), lm=toy_lm, rescorer=tiny_model("gpt2", seed=7), alpha=1.0,
                     nbest=8, references=refs)
    r = bpd_decode(model, ps, d, BpdPlan(kv_cache="rolling"), Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert r.verify_mode == "tree"


@pytest.mark.parametrize("name", ["neural", "model"])
def test_a_small_lm_of_fewer_positions_drafts_from_the_latest_ones(name):
    """The neural rescorer and the auxiliary draft model (``IncrementalLM``) with 16 positions
    against prompts of 24..31 tokens + 20 new: drafts only, so the output is still exact."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model, ps, refs = _case(8, 4)
    torch.manual_seed(0)
    short = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    d = make_drafter(name, options=LatticeOptions(k=8), rescorer=short, alpha=1.0, draft_model=short, gamma=3)
    r = bpd_decode(model, ps, d, request=Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in r.sequences] == refs


@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_loop_context_ngrams_and_lookahead_pool_over_the_rolling_cache(batch, toy_lm):
    model, ps, refs = _case(8, batch)
    plain = bpd_decode(
        model, ps, None, BpdPlan(kv_cache="rolling"), Request(max_new_tokens=MAX_NEW)
    )  # latticedraft's greedy loop
    assert [s.tokens.tolist() for s in plain.sequences] == refs
    assert [s.tokens.tolist() for s in greedy_decode(model, ps, max_new_tokens=MAX_NEW).sequences] == refs
    d = make_drafter("parallel-base", options=LatticeOptions(k=4), alpha=1.0, nbest=4)
    mixed = bpd_decode(
        model,
        ps,
        d,
        BpdPlan(kv_cache="rolling", sources=(ContextProposer(ContextNgrams(max_ngram=3)),), lookahead=LookaheadOptions(W=4, N=3, G=4)),
        Request(max_new_tokens=MAX_NEW),
    )  # side branches ride in the same forward
    assert [s.tokens.tolist() for s in mixed.sequences] == refs
    full = bpd_decode(model, ps, d, BpdPlan(kv_cache="full"), Request(max_new_tokens=MAX_NEW))
    assert [s.tokens.tolist() for s in full.sequences] == refs


@pytest.mark.parametrize("batch", [1, 4])
def test_lookahead_decoding_over_the_rolling_cache_equals_generate(batch):
    model, ps, refs = _case(12 if batch == 1 else 8, batch)
    r = lookahead_decode(model.base, ps, W=5, N=3, G=5, max_new_tokens=MAX_NEW, kv_cache="rolling")
    assert [s.tokens.tolist() for s in r.sequences] == refs


def test_refusal_names_length_limit_and_fix():
    check_fits(64, [40, 44], 20)  # fits exactly
    with pytest.raises(InputError) as e:
        check_fits(64, [40, 50], 20)
    msg = str(e.value)
    assert "50 tokens" in msg and "64 positions" in msg and "--truncate-left 44" in msg and "\n" not in msg
    with pytest.raises(InputError, match="lower --max-new-tokens to 61 at most"):
        check_fits(64, [3], 64)  # the most this prompt leaves room for, not the model's limit
    with pytest.raises(InputError, match="--truncate-left 54 .*, or lower --max-new-tokens to 4 at most"):
        check_fits(64, [60], 10)
    check_fits(64, [60], 4)  # that most is accepted
    assert [p.tolist() for p in truncate_left([[1, 2, 3, 4], [5]], 2)] == [[3, 4], [5]]
    model, ps, _ = _case(8, 1)
    with pytest.raises(InputError, match="--truncate-left"):
        bpd_decode(model, [np.ones(250, dtype=np.int64)], None, request=Request(max_new_tokens=10))  # 256 positions


@pytest.mark.skipif(not (data_dir() / "tokenizer" / "tokenizer.json").is_file(), reason="bundled tokenizer missing")
def test_cli_refuses_before_decoding_then_truncate_left_decodes(tmp_path, capsys):
    bundle = save_bpd_bundle(tmp_path, [])  # GPT-2 base with 256 positions
    capsys.readouterr()
    long_prompt = "x = 1\n" * 200  # ~600 tokens
    args = ["decode", "--model", str(bundle / "heads"), "--prompt", long_prompt, "--max-new-tokens", "6"]
    assert main(args) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and "exceeds the model's 256 positions" in cap.err and "--truncate-left 250" in cap.err
    assert len(cap.err.strip().splitlines()) == 1 and cap.err.startswith("error:")
    assert main(args + ["--json", "--truncate-left", "250"]) == 0
    import json

    rec = json.loads(capsys.readouterr().out)
    assert len(rec["tokens"]) == 6
    assert main(args + ["--truncate-left", "0"]) == 2
    assert "--truncate-left 0" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not (data_dir() / "tokenizer" / "tokenizer.json").is_file(), reason="bundled tokenizer missing")
def test_cli_decodes_a_1500_token_prompt_on_a_long_context_mistral_bundle(tmp_path, capsys):
    """A bundle shaped like the long-context default (Mistral base, 2048 positions, window 16 here):
    a 1 500-token held-out prompt decodes through the CLI (rolling cache, ~94 prefill chunks) to
    HF greedy's tokens, in BPD and lookahead."""
    import json

    from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM

    from latticedraft.gpu.models.blockwise import BlockwiseModel
    from latticedraft.lm.corpus import read_text, stdlib_split

    torch.manual_seed(0)
    base = MistralForCausalLM(
        MistralConfig(
            vocab_size=8192,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            sliding_window=16,
            tie_word_embeddings=True,
        )
    ).eval()
    base.save_pretrained(tmp_path / "base")
    BlockwiseModel.from_base(base, 4, seed=0).save_pretrained(tmp_path / "heads", base_ref="../base")
    from latticedraft.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(data_dir() / "tokenizer")
    text = "".join(read_text(f) for f in stdlib_split("heldout")[:3])[:12000]
    ids = tok.encode(text).ids[-1500:]  # what --truncate-left 1500 keeps
    assert len(ids) == 1500
    capsys.readouterr()
    ref = None
    for method in ("bpd", "lookahead"):
        rc = main(
            [
                "decode",
                "--model",
                str(tmp_path / "heads"),
                "--prompt",
                text,
                "--max-new-tokens",
                "8",
                "--json",
                "--truncate-left",
                "1500",
                "--method",
                method,
            ]
        )
        assert rc == 0
        rec = json.loads(capsys.readouterr().out)
        assert rec["prompt_ids"] == ids
        if ref is None:
            m = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
            x = torch.tensor([ids])
            ref = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=8, pad_token_id=0)[
                0, 1500:
            ].tolist()
        assert rec["tokens"] == ref


@pytest.mark.parametrize("row", [0, 3])
def test_rows_leaving_the_batch_on_eos_over_the_rolling_cache(row, toy_lm):
    """Prompts shorter than the window: the buffer holds as many slots as the longest row has
    positions. When that row stops and leaves the batch, the buffer is longer than any
    remaining row's positions, and must keep working (it used to fail to roll in)."""
    model = blockwise("mistral", torch.float32, num_heads=4, seed=3, window=64)
    ps = prompts(4, seed=5, lengths=(3, 9, 5, 14))
    free = [reference(model, p, MAX_NEW) for p in ps]
    eos = free[row][1]
    refs = [reference(model, p, MAX_NEW, eos=eos) for p in ps]
    d = make_drafter("parallel", options=LatticeOptions(k=8), lm=toy_lm, nbest=4)
    r = bpd_decode(model, ps, d, BpdPlan(kv_cache="rolling"), Request(max_new_tokens=MAX_NEW, eos_token_id=eos))
    assert [s.tokens.tolist() for s in r.sequences] == refs
    assert len(refs[row]) < MAX_NEW  # the row did stop early
