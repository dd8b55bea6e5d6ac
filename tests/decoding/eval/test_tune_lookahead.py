"""``tune --method lookahead``: the prediction from measured steps and T(n), the pick is the
argmax of the tuner's own table, the JSON it writes drives ``decode --lookahead-config`` (whose
output still equals greedy), and bad files or combinations are refused before loading."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from latticedraft.cli import main
from latticedraft.decoding.eval.tune_lookahead import Row, best, predict
from latticedraft.decoding.methods.lookahead import read_lookahead_config
from latticedraft.errors import InputError
from tests.cli.test_decode import TOKENIZER, _greedy, bundle  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _result(*seqs):
    return SimpleNamespace(sequences=[SimpleNamespace(tokens_per_call=t, tree_nodes=n) for t, n in seqs])


def test_prediction_is_tokens_over_the_summed_step_cost():
    # prefill calls (first entry) are left out: steps emit 3, 2 | 4 tokens over 10, 20 | 30 nodes
    r = predict(_result(([1, 3, 2], [10, 20]), ([1, 4], [30])), lambda n: 0.001 * np.asarray(n) + 0.01)
    assert r.tokens_per_step == pytest.approx(3.0) and r.nodes_per_step == pytest.approx(20.0)
    assert r.predicted_tokens_per_s == pytest.approx(9 / (0.02 + 0.03 + 0.04))
    assert predict(_result(([1], [])), lambda n: n) is None


def test_best_is_the_argmax_and_ties_prefer_fewer_nodes():
    rows = [Row(3, 3, 3, 2.0, 20, 100.0), Row(7, 4, 7, 2.5, 40, 120.0), Row(1, 2, 0, 1.0, 2, 120.0)]
    assert best(rows) == rows[2]
    with pytest.raises(InputError):
        best([])


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)")
def test_tune_lookahead_writes_its_argmax_and_decode_reads_it(bundle, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "la.json"
    assert main(["tune", "--method", "lookahead", "--model", str(bundle / "heads"), "--prompts",
                 str(bundle / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "10", "--windows", "1", "3",
                 "--ngrams", "2", "3", "--pools", "0", "2", "--prompt-as-reference", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    t = json.loads(out.read_text())
    assert len(t["table"]) == 8 and t["prompts"] == 2
    top = max(t["table"], key=lambda r: r["predicted_tokens_per_s"])
    pick = t["lookahead"]
    assert t["predicted_tokens_per_s"] == top["predicted_tokens_per_s"]
    assert [pick["W"], pick["N"], pick["G"]] == [top["W"], top["N"], top["G"]] and pick["prompt_as_reference"]
    assert f"best: W={pick['W']} N={pick['N']} G={pick['G']}" in printed
    assert read_lookahead_config(out) == pick

    assert main(["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"),
                 "--method", "lookahead", "--lookahead-config", str(out), "--max-new-tokens", "12", "--json"]) == 0
    for line in capsys.readouterr().out.strip().splitlines():
        r = json.loads(line)
        assert r["method"] == f"lookahead W={pick['W']} N={pick['N']} G={pick['G']}"
        assert r["tokens"] == _greedy(r["model"], r["prompt_ids"], 12)


@pytest.mark.parametrize("content,needle", [
    (None, "not found"),
    ("{}", "'lookahead' object"),
    ('{"lookahead": {"W": 0, "N": 3, "G": 1}}', "W=0"),
])
def test_bad_lookahead_configs_are_refused_before_loading(tmp_path, capsys, content, needle):
    cfg = tmp_path / "la.json"
    if content is not None:
        cfg.write_text(content)
    assert main(["decode", "--model", str(tmp_path / "no-model"), "--prompt", "x", "--method", "lookahead",
                 "--lookahead-config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --lookahead-config") and needle in err and "\n" not in err


@pytest.mark.parametrize("args,needle", [
    (["decode", "--method", "lookahead", "--lookahead-config", "{cfg}", "--window", "4"], "--window"),
    (["decode", "--method", "greedy", "--lookahead-config", "{cfg}"], "--lookahead-config"),
    (["tune", "--method", "lookahead", "--grid", "1.0"], "--grid"),
    (["tune", "--windows", "3"], "--windows"),
    (["tune", "--method", "lookahead", "--ngrams", "1"], "--ngrams"),
    (["tune", "--method", "lookahead", "--pools", "-1"], "--pools"),
])
def test_lookahead_tuning_options_are_checked_before_loading(tmp_path, capsys, args, needle):
    cfg = tmp_path / "la.json"
    cfg.write_text('{"lookahead": {"W": 3, "N": 3, "G": 2}}')
    extra = ["--prompt", "x"] if args[0] == "decode" else ["--out", str(tmp_path / "t.json")]
    argv = [a.format(cfg=cfg) for a in args] + ["--model", str(tmp_path / "no-model")] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "no-model" not in err and "\n" not in err
    assert not (tmp_path / "t.json").exists()
