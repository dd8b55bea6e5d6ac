"""The decode / eval / tune / demo commands end to end on a tiny random BPD model saved the
way the bundled one is (heads checkpoint + HF base directory), with the bundled tokenizer."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from latticedraft.cli import main
from latticedraft.paths import data_dir, default_lm_dir
from tests.decoding.tiny import save_bpd_bundle

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return save_bpd_bundle(tmp_path_factory.mktemp("bundle"), ["def f(x):\n    return", "import os\n",
                                                                "class A:\n    def __init__(self):\n"], rescorer=True)


def _greedy(model_dir, ids, n):
    m = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    x = torch.tensor([ids])
    return m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, pad_token_id=0)[0, len(ids):].tolist()


@pytest.mark.parametrize("drafter,batch", [("top1", 3), ("parallel-base", 2), ("oracle", 2)])
def test_decode_json_matches_generate_of_the_named_base(bundle, capsys, drafter, batch):
    """One record per prompt, in input order: a batch of 2 over 3 prompts runs as a continuous batch
    (rows finish in any order), and each record is written once those before it are."""
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
               "--drafter", drafter, "--max-new-tokens", "12", "--json", "--batch-size", str(batch)])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    want = [json.loads(x)["prompt"] for x in (bundle / "prompts.jsonl").read_text().splitlines()]
    assert [json.loads(x)["prompt"] for x in lines] == want
    for line in lines:
        r = json.loads(line)
        assert set(r) >= {"prompt_ids", "tokens", "text", "calls", "block_efficiency", "accepted_per_step", "seconds", "model"}
        assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)
        assert r["block_efficiency"] == pytest.approx(len(r["tokens"]) / r["calls"], abs=1e-3)


@pytest.mark.parametrize("method", [["--method", "greedy"], ["--drafter", "top1"]])
def test_decode_in_bfloat16_equals_generate_in_bfloat16(bundle, capsys, method):
    """``--dtype bfloat16``: the base and its heads load in bfloat16 and the output is ``generate``'s on the
    base in bfloat16 (the greedy loop: one position per call; top-1 drafts on this tiny model: no near-ties)."""
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"), "--dtype",
               "bfloat16", "--max-new-tokens", "10", "--json", *method])
    assert rc == 0
    for line in capsys.readouterr().out.strip().splitlines():
        r = json.loads(line)
        m = AutoModelForCausalLM.from_pretrained(r["model"], dtype=torch.bfloat16).eval()
        x = torch.tensor([r["prompt_ids"]])
        want = m.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=10, pad_token_id=0)
        assert r["tokens"] == want[0, x.shape[1]:].tolist()


def test_decode_streams_text_and_greedy_method(bundle, capsys):
    assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "def f(x):", "--max-new-tokens", "6"]) == 0
    bpd = capsys.readouterr()
    assert bpd.out.startswith("def f(x):") and "block efficiency" in bpd.err
    assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "def f(x):", "--max-new-tokens", "6",
                 "--method", "greedy"]) == 0
    assert capsys.readouterr().out == bpd.out


@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_decode_ngram_with_the_bundled_lm(bundle, capsys):
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompt", "import os\n", "--drafter", "parallel",
               "--nbest", "4", "--prune", "otsu", "--max-new-tokens", "10", "--json"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 10)


def test_decode_with_fewer_slots(bundle, capsys):
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompt", "import os\n", "--drafter", "parallel-base",
               "--nbest", "4", "--slots", "1", "--max-new-tokens", "10", "--json", "--context-ngrams", "0"])
    assert rc == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 10)
    assert max(r["accepted_per_step"]) <= 1
    assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "x", "--slots", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--slots 0" in err and "\n" not in err


@pytest.mark.parametrize("flags", [["--tree", "fixed", "--context-ngrams", "0", "--draft-vocab", "0"],
                                   ["--tree", "auto", "--context-ngrams", "2"], ["--tree", "fixed", "--context-ngrams", "4"]])
def test_decode_tree_context_and_vocab_flags_stay_greedy(bundle, capsys, flags):
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"), "--drafter",
               "parallel-base", "--nbest", "4", "--max-new-tokens", "12", "--json", "--batch-size", "2", *flags])
    assert rc == 0
    for line in capsys.readouterr().out.splitlines():
        r = json.loads(line)
        assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)
        assert len(r["tree_nodes_per_step"]) == len(r["accepted_per_step"])
    for bad in (["--draft-vocab", "x"], ["--context-ngrams", "-2"]):
        assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "x", *bad]) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: " + bad[0])
    with pytest.raises(SystemExit) as e:
        main(["decode", "--prompt", "x", "--tree", "big"])
    assert e.value.code == 2 and "--tree" in capsys.readouterr().err


def test_decode_without_head_drafts_is_prompt_lookup_on_the_verifier(bundle, capsys):
    for flags in (["--context-ngrams", "3"], ["--context-ngrams", "0", "--tree", "fixed"]):
        rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
                   "--drafter", "none", "--max-new-tokens", "12", "--json", *flags])
        assert rc == 0
        for line in capsys.readouterr().out.splitlines():
            r = json.loads(line)
            assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)
            assert set(r["heads_per_step"]) <= {0}
    assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "x", "--drafter", "none", "--slots", "2"]) == 2
    assert "--slots" in capsys.readouterr().err.strip().splitlines()[-1]


def test_eval_refuses_flags_that_name_one_drafter(bundle, capsys, tmp_path):
    for flags in (["--drafter", "parallel"], ["--slots", "2"]):
        assert main(["eval", "--model", str(bundle / "heads"), *flags, "--out", str(tmp_path / "e")]) == 2
        err = capsys.readouterr().err.strip()
        assert flags[0] in err and "eval runs every drafter" in err and "\n" not in err
    assert not (tmp_path / "e").exists()


def test_user_errors_are_one_line(bundle, capsys, tmp_path):
    assert main(["decode", "--model", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "nope" in err and "\n" not in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    assert main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bad)]) == 2
    assert "line 2" in capsys.readouterr().err
    assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "x", "--drafter", "neural",
                 "--rescorer", str(tmp_path / "none")]) == 2
    cap = capsys.readouterr()
    assert "--rescorer" in cap.err and cap.out == ""  # fails before streaming anything
    assert main(["decode", "--model", str(bundle / "heads"), "--prompt", "x", "--drafter", "ngram",
                 "--lm", str(tmp_path / "nolm")]) == 2
    cap = capsys.readouterr()
    assert "nolm" in cap.err and cap.out == ""


@pytest.mark.slow
@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_tune_then_eval_write_tables_and_figures(bundle, tmp_path, capsys):
    tuned = tmp_path / "tuned.json"
    assert main(["tune", "--model", str(bundle / "heads"), "--rescorer", str(bundle / "resc"),
                 "--prompts", str(bundle / "prompts.jsonl"), "--num-prompts", "1", "--grid", "0.5", "2.0",
                 "--max-new-tokens", "6", "--out", str(tuned)]) == 0
    t = json.loads(tuned.read_text())
    assert set(t["alphas"]) == {"ngram", "neural"} and t["alphas"]["ngram"] in (0.5, 2.0)
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(bundle / "heads"), "--rescorer", str(bundle / "resc"),
                 "--prompts", str(bundle / "prompts.jsonl"), "--skip", "1", "--num-prompts", "2",
                 "--max-new-tokens", "8", "--alphas", str(tuned), "--prune", "otsu", "--window", "3", "--pool", "2",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["all_exact"] and res["runs"]["Base"]["block_efficiency"] >= 1.0
    look = res["runs"]["Lookahead (W=3, N=5, G=2)"]
    assert look["exact"] and look["spec"]["W"] == 3 and look["calls"] >= look["tokens"] / 5
    assert res["config"]["prune"] == "otsu" and res["runs"]["Parallel 4-gram BPD"]["spec"]["prune"] == "otsu"
    md = (out / "results.md").read_text()
    assert "Otsu pruning (eps 0.001)" in md.splitlines()[0]
    for needle in ("Table 4", "Parallel 4-gram BPD", "Oracle (k=16)", "Table 3", "Table 5", "Table 10",
                   "| Lookahead (W=3, N=5, G=2) |", "| Base + --self-draft auto |", "| Base + every source |"):
        assert needle in md
    for row in ("Base + --context-ngrams 3", "Base + --lm-drafts auto", "Base + --self-draft auto"):  # decode's defaults
        assert res["runs"][row]["exact"], row
    for png in ("fig6_oracle_vs_k.png", "fig7_parallel_vs_p.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("*.tmp*"))


@pytest.mark.slow
@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_demo_confirms_exactness(bundle, tmp_path, capsys):
    rc = main(["demo", "--model", str(bundle / "heads"), "--rescorer", str(bundle / "resc"),
               "--prompts", str(bundle / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "8",
               "--out", str(tmp_path / "demo")])
    out = capsys.readouterr().out
    assert rc == 0 and "every output equals HF greedy's, token for token: yes" in out
    assert (tmp_path / "demo" / "lattice_step.png").is_file()
    for row in ("HF greedy", "HF prompt lookup", "HF assisted (int4 copy)", "latticedraft default (CLI)",
                "self-draft alone", "BPD: n-gram-rescored heads", "context + LM n-grams"):
        assert row in out
    rows = {r["name"]: r for r in json.loads((tmp_path / "demo" / "demo.json").read_text())["rows"]}
    assert rows["latticedraft default (CLI)"]["tokens_per_call"] >= 1 and all(r["exact"] for r in rows.values())


def _ided_prompts(tmp_path):
    f = tmp_path / "ided.jsonl"
    f.write_text(json.dumps({"id": "q7", "prompt": "import os\n"}) + "\n\n" + json.dumps({"prompt": "class A:"})
                 + "\n" + json.dumps({"id": 9, "prompt": "def f(x):"}) + "\n")
    return f


@pytest.mark.parametrize("mode", [["--json"], ["--json", "--batch-size", "2"], ["--output", "OUT"]])
def test_every_record_carries_its_prompts_id(bundle, capsys, tmp_path, mode):
    """Issue 59, class F: a record names its prompt by the record's ``id``, else its line number (never null)."""
    out = tmp_path / "out.jsonl"
    argv = ["decode", "--model", str(bundle / "heads"), "--prompts", str(_ided_prompts(tmp_path)),
            "--max-new-tokens", "4", *[str(out) if m == "OUT" else m for m in mode]]
    assert main(argv) == 0
    text = out.read_text() if out.exists() else capsys.readouterr().out
    assert [json.loads(x)["id"] for x in text.splitlines()] == ["q7", 3, 9]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", None])
def test_the_weights_dtype_is_named_in_every_record_and_summary(bundle, capsys, tmp_path, dtype):
    """Issue 59, class F: half precision keeps a weaker guarantee than float32, so each record names the
    dtype it was decoded in, and each summary line names a half-precision one."""
    args = ["decode", "--model", str(bundle / "heads"), "--max-new-tokens", "4", *(["--dtype", dtype] if dtype else [])]
    want = dtype or "float32"
    assert main([*args, "--prompt", "def f(x):"]) == 0
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    assert summary.startswith("-- ") and (f"{want} weights" in summary) == (dtype is not None), summary
    assert main([*args, "--prompts", str(bundle / "prompts.jsonl"), "--json"]) == 0
    assert {json.loads(x)["dtype"] for x in capsys.readouterr().out.splitlines()} == {want}
    out = tmp_path / "out.jsonl"
    assert main([*args, "--prompts", str(bundle / "prompts.jsonl"), "--output", str(out)]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert any(ln.startswith("decoded 3 of 3") and (f"{want} weights" in ln) == (dtype is not None) for ln in lines)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["dtype"] for r in recs} == {want} and {r["settings"].get("dtype") for r in recs} == {dtype}
