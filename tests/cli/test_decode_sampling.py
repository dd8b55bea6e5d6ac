"""``decode --do-sample`` (lossless sampling), ``--drafter model`` and ``--method mtad`` end to end
on the tiny saved bundle of ``tests/cli/test_decode.py``."""

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from latticedraft.cli import main
from tests.cli.test_decode import TOKENIZER, _greedy, bundle  # noqa: F401  (fixture)

pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]


def _json(capsys, argv):
    assert main(argv) == 0
    return [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]


def test_do_sample_is_seeded_and_batch_independent(bundle, capsys):  # noqa: F811
    def run(seed, batch):
        recs = _json(capsys, ["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
                              "--drafter", "parallel-base", "--nbest", "3", "--do-sample", "--temperature", "1.5",
                              "--top-k", "0", "--seed", str(seed), "--max-new-tokens", "12", "--json",
                              "--batch-size", str(batch)])
        assert all(r["method"] == f"bpd/parallel-base sampling T=1.5 top-k=0 top-p=1.0 seed={seed}" for r in recs)
        return [r["tokens"] for r in recs]

    first = run(3, 3)
    assert run(3, 1) == first and run(4, 3) != first


def test_every_lossless_decoder_samples_the_same_tokens_and_a_run_repeats(bundle, capsys):  # noqa: F811
    """For a seed, the default (heads, n-grams, cost-aware tree, head gate), other drafters, batches and
    lookahead emit the same tokens: the plain sampler's under the run's noise. The default's plan
    follows measured time, and the tokens still repeat run after run."""
    from latticedraft.decoding.accept.sampling import SamplingOptions
    from latticedraft.decoding.runs.loaders import load_model
    from tests.decoding.tiny import sampled_reference

    args = ["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"), "--do-sample",
            "--temperature", "0.9", "--seed", "11", "--max-new-tokens", "12", "--json"]
    default = _json(capsys, args + ["--batch-size", "2"])
    model = load_model(str(bundle / "heads"))
    opts = SamplingOptions(temperature=0.9, seed=11)
    want = [sampled_reference(model, r["prompt_ids"], 12, opts, row=i) for i, r in enumerate(default)]
    assert [r["tokens"] for r in default] == want
    for more in (["--batch-size", "2"], ["--drafter", "top1", "--tree", "fixed"], ["--drafter", "none"],
                 ["--method", "lookahead"]):
        assert [r["tokens"] for r in _json(capsys, args + more)] == want, more


def test_do_sample_on_a_model_without_heads_drafts_its_ngrams(bundle, capsys):  # noqa: F811
    """The default drafter on a plain causal LM samples with the context n-grams (as --drafter none
    does, same tokens); another head drafter named on it is refused in one line."""
    args = ["decode", "--model", str(bundle / "base"), "--prompts", str(bundle / "prompts.jsonl"), "--do-sample",
            "--seed", "5", "--max-new-tokens", "10", "--json"]
    default, none = _json(capsys, args), _json(capsys, args + ["--drafter", "none"])
    assert all(r["method"].startswith("bpd/none sampling") for r in default)
    assert [r["tokens"] for r in default] == [r["tokens"] for r in none]
    assert main(args + ["--drafter", "parallel-base"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --drafter parallel-base drafts from multi-token heads") and "\n" not in err


@pytest.mark.slow
def test_model_drafter_greedy_equals_generate_and_mtad_runs(bundle, capsys):  # noqa: F811
    args = ["decode", "--model", str(bundle / "base"), "--prompts", str(bundle / "prompts.jsonl"),
            "--draft-model", str(bundle / "resc"), "--max-new-tokens", "10", "--json"]
    for r in _json(capsys, args + ["--drafter", "model", "--gamma", "3"]):
        assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 10)
    recs = _json(capsys, args + ["--method", "mtad", "--tau", "0.5", "--beams", "2", "--gamma", "2"])
    assert all(r["method"].startswith("mtad gamma=2 beams=2 tau=0.5 (approximate) sampling T=1.0 top-k=20 top-p=0.9")
               and len(r["tokens"]) == 10 for r in recs)


def test_a_draft_model_with_another_vocabulary_is_refused(bundle, tmp_path, capsys):  # noqa: F811
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=64, n_embd=8, n_layer=1, n_head=2)).save_pretrained(tmp_path)
    assert main(["decode", "--model", str(bundle / "base"), "--prompt", "x", "--drafter", "model",
                 "--draft-model", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--draft-model" in err and "100" in err and "\n" not in err


@pytest.mark.slow
def test_eval_do_sample_reports_sampled_runs(bundle, tmp_path, capsys):  # noqa: F811
    from latticedraft.paths import default_lm_dir

    if not default_lm_dir().exists():
        pytest.skip("bundled 4-gram missing (run scripts/setup.sh)")
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(bundle / "heads"), "--rescorer", str(bundle / "resc"),
                 "--prompts", str(bundle / "prompts.jsonl"), "--num-prompts", "1", "--max-new-tokens", "6",
                 "--window", "3", "--pool", "2", "--do-sample", "--temperature", "0.7", "--seed", "3",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["sampling"]["temperature"] == 0.7 and res["runs"]["greedy"]["exact"] is True
    assert res["runs"]["Base"]["exact"] is None and not any(n.startswith("Oracle") for n in res["runs"])
    assert "Sampled losslessly" in (out / "results.md").read_text() and not (out / "fig6_oracle_vs_k.png").exists()
    assert main(["eval", "--model", str(bundle / "heads"), "--top-p", "0.5", "--out", str(tmp_path / "e2")]) == 2
    assert "--do-sample" in capsys.readouterr().err
