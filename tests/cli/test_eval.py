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
