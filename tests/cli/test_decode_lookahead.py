"""``decode --method lookahead`` end to end on the tiny saved bundle of ``tests/cli/test_decode.py``: JSON
records and streamed text equal ``generate`` of the named base; its options are checked (and
refused for other methods) before any model is loaded."""

import json

import pytest

from latticedraft.cli import main
from tests.cli.test_decode import TOKENIZER, _greedy, bundle  # noqa: F401  (fixture)

pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]


def test_decode_lookahead_json_matches_generate(bundle, capsys):  # noqa: F811
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
               "--method", "lookahead", "--window", "4", "--ngram", "3", "--pool", "4", "--prompt-as-reference",
               "--max-new-tokens", "12", "--json", "--batch-size", "3"])
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        r = json.loads(line)
        assert r["method"] == "lookahead W=4 N=3 G=4" and r["verify"] == "tree"
        assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)
        assert sum(r["tokens_per_call"]) == len(r["tokens"]) and len(r["tokens_per_call"]) == r["calls"]
        assert r["block_efficiency"] == pytest.approx(len(r["tokens"]) / r["calls"], abs=1e-3)


def test_decode_lookahead_streams_the_greedy_text(bundle, capsys):  # noqa: F811
    args = ["decode", "--model", str(bundle / "heads"), "--prompt", "def f(x):", "--max-new-tokens", "8"]
    assert main(args + ["--method", "greedy"]) == 0
    greedy = capsys.readouterr().out
    assert main(args + ["--method", "lookahead", "--verify", "batched"]) == 0
    cap = capsys.readouterr()
    assert cap.out == greedy and "lookahead W=15 N=5 G=15, verify batched" in cap.err


def test_decode_bpd_with_the_lookahead_pool_matches_generate(bundle, capsys):  # noqa: F811
    rc = main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
               "--drafter", "parallel-base", "--lookahead-pool", "--window", "3", "--ngram", "3", "--pool", "3",
               "--max-new-tokens", "12", "--json", "--batch-size", "2"])
    assert rc == 0
    for line in capsys.readouterr().out.strip().splitlines():
        r = json.loads(line)
        assert r["method"] == "bpd/parallel-base" and r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)


@pytest.mark.parametrize("flags,named", [
    (["--method", "bpd", "--window", "4"], "--window"),
    (["--method", "lookahead", "--lookahead-pool"], "--lookahead-pool"),
    (["--method", "greedy", "--lookahead-pool"], "--lookahead-pool"),
    (["--method", "greedy", "--prompt-as-reference"], "--prompt-as-reference"),
    (["--method", "lookahead", "--drafter", "parallel"], "--drafter"),
    (["--method", "lookahead", "--tree", "fixed"], "--tree"),
    (["--method", "lookahead", "--ngram", "1"], "--ngram"),
    (["--method", "lookahead", "--pool", "-1"], "--pool"),
    (["--method", "lookahead", "--window", "0"], "--window"),
])
def test_lookahead_options_are_checked_before_loading(tmp_path, capsys, flags, named):
    assert main(["decode", "--model", str(tmp_path / "no-such-model"), "--prompt", "x", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and named in err and "no-such-model" not in err and "\n" not in err


def test_decode_lookahead_sampling_seed_reproduces(bundle, capsys):  # noqa: F811
    def run(seed, batch):
        argv = ["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
                "--method", "lookahead", "--window", "3", "--ngram", "3", "--pool", "3", "--do-sample", "--temperature", "1.5",
                "--top-k", "0", "--top-p", "0.99", "--seed", str(seed), "--max-new-tokens", "16", "--json",
                "--batch-size", str(batch)]
        assert main(argv) == 0
        recs = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
        assert all(r["method"].endswith(f"sampling T=1.5 top-k=0 top-p=0.99 seed={seed}") for r in recs)
        return [r["tokens"] for r in recs]

    first = run(3, 3)
    assert run(3, 1) == first  # same seed: same tokens, one prompt at a time or batched
    assert run(4, 3) != first
    greedy = [_greedy(str(bundle / "base"), ids, 16) for ids in
              [json.loads(x)["prompt_ids"] for x in _records(bundle, capsys)]]
    assert first != greedy


def _records(bundle, capsys):  # noqa: F811
    assert main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
                 "--method", "lookahead", "--max-new-tokens", "2", "--json"]) == 0
    return capsys.readouterr().out.strip().splitlines()


@pytest.mark.parametrize("flags,named", [
    (["--method", "lookahead", "--top-k", "5"], "--top-k"),
    (["--method", "lookahead", "--seed", "2"], "--seed"),
    (["--method", "lookahead", "--temperature", "0.7"], "--temperature"),  # sampling needs --do-sample
    (["--method", "lookahead", "--do-sample", "--temperature", "0"], "--temperature"),
    (["--method", "lookahead", "--do-sample", "--temperature", "nan"], "--temperature"),
    (["--method", "lookahead", "--do-sample", "--top-p", "0"], "--top-p"),
    (["--method", "lookahead", "--do-sample", "--top-p", "1.5"], "--top-p"),
    (["--method", "lookahead", "--do-sample", "--top-k", "-1"], "--top-k"),
    (["--method", "lookahead", "--do-sample", "--epsilon-b", "0.2"], "--epsilon-b"),
    (["--method", "greedy", "--top-p", "0.9"], "--top-p"),
    (["--method", "dynamo", "--top-p", "0.9"], "--top-p"),
    (["--method", "bpd", "--temperature", "0.7"], "--temperature"),
    (["--method", "bpd", "--do-sample", "--repetition-penalty", "0"], "--repetition-penalty"),
    (["--method", "bpd", "--do-sample", "--drafter", "oracle"], "--drafter oracle"),
    (["--method", "bpd", "--drafter", "model"], "--draft-model"),
    (["--method", "bpd", "--gamma", "3"], "--gamma"),
    (["--method", "mtad"], "--draft-model"),
    (["--method", "mtad", "--draft-model", "d", "--tau", "-1"], "--tau"),
    (["--method", "mtad", "--draft-model", "d", "--beams", "0"], "--beams"),
    (["--method", "mtad", "--draft-model", "d", "--drafter", "parallel"], "--drafter"),
    (["--method", "bpd", "--tau", "0.5"], "--tau"),
    (["--method", "greedy", "--do-sample"], "--do-sample"),
])
def test_lookahead_sampling_options_are_checked_before_loading(tmp_path, capsys, flags, named):
    assert main(["decode", "--model", str(tmp_path / "no-such-model"), "--prompt", "x", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and named in err and "no-such-model" not in err and "\n" not in err
