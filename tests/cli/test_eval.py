"""``latticedraft eval``: the paper's tables (``--method bpd``) and the DynaMo ablation (``--method
dynamo``) each refuse the other's own options, read from the tables that declare them."""

import pytest

from latticedraft.cli import main
from latticedraft.cli.eval import ABLATION, ABLATION_FLAGS, TABLE_FLAGS, TABLES


def _last_error(capsys, args) -> str:
    assert main(args) != 0
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_option_lists_are_the_declared_flags():
    assert ABLATION == tuple(f[2:].replace("-", "_") for f in ABLATION_FLAGS) and "heldout_tokens" in ABLATION
    assert TABLES == tuple(f[2:].replace("-", "_") for f in TABLE_FLAGS) and "lm2" in TABLES


@pytest.mark.parametrize("flag,value", [("--lm2", "x"), ("--batch-size", "2"), ("--skip", "1")])
def test_the_ablation_refuses_the_tables_options(capsys, tmp_path, flag, value):
    last = _last_error(capsys, ["eval", "--method", "dynamo", flag, value, "--out", str(tmp_path / "o")])
    assert flag in last and "eval --method dynamo runs the DynaMo ablation" in last


@pytest.mark.parametrize("flag,value", [("--epsilons", "0.1"), ("--heldout-tokens", "0")])
def test_the_tables_refuse_the_ablation_options(capsys, tmp_path, flag, value):
    last = _last_error(capsys, ["eval", flag, value, "--out", str(tmp_path / "o")])
    assert flag in last and "apply to --method dynamo" in last


def test_eval_takes_the_draft_sources_options_from_the_same_declarations_as_decode():
    """Issue 63, class C: every draft source's option (``decoding/sources.py``) is an eval option with
    decode's default, choices and help; each source that is on gets a "Base + source" row."""
    from latticedraft.cli import build_parser
    from latticedraft.cli.parser import commands
    from latticedraft.decoding.eval.evaluate import EvalConfig, _source_plan, source_row
    from latticedraft.decoding.methods.bpd import DrafterSpec
    from latticedraft.decoding.sources import sources

    parsers = dict(commands(build_parser()))
    decode, eval_ = (parsers[(name,)] for name in ("decode", "eval"))
    for s in sources():
        d, e = decode._option_string_actions[s.flag], eval_._option_string_actions[s.flag]
        kind = lambda a: getattr(a.type, "inner", a.type)  # noqa: E731  (each parser wraps it)
        assert (e.default, e.choices, e.help, kind(e)) == (d.default, d.choices, d.help, kind(d)), s.flag
    on = {"self_draft": "int4", "context_ngrams": 3}
    rows = _source_plan(DrafterSpec("top1"), on)
    assert [r[0] for r in rows] == [source_row(*kv) for kv in on.items()] + ["Base + every source"]
    assert rows[0][0] == "Base + --self-draft int4" and rows[0][2].self_draft == "int4" and rows[0][2].context_ngrams == 0
    assert EvalConfig().sources == {}


@pytest.mark.parametrize("flags, needle", [(["--self-draft", "int2"], "--self-draft"),
                                           (["--context-ngrams", "-1"], "--context-ngrams -1"),
                                           (["--method", "dynamo", "--self-draft", "int4"], "--self-draft")])
def test_eval_refuses_a_bad_source_value_in_one_line(capsys, tmp_path, flags, needle):
    try:
        rc = main(["eval", *flags, "--out", str(tmp_path / "o")])
    except SystemExit as e:  # argparse's choices: its error line, then where to read the help
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and needle in err[0] and err[0].startswith("error: ") and not (tmp_path / "o").exists(), err
