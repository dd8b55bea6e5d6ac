"""``decode --prompts IN --output OUT`` in one process (issue 13): records with ids and a settings
fingerprint, --resume, refusals that leave OUT as it was, --skip-bad, --sort-by-length, stdin and
stdout, the progress bar. Killed runs: test_dataset_kill.py; torchrun: test_dataset_torchrun.py."""

import io
import json
import sys

import pytest

from latticedraft.cli import main
from latticedraft.decoding.runs.dataset import progress_bar
from latticedraft.decoding.runs.shards import World
from latticedraft.paths import data_dir
from tests.decoding.tiny import save_bpd_bundle

TOKENIZER = data_dir() / "tokenizer" / "tokenizer.json"
pytestmark = [pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)"),
              pytest.mark.usefixtures("one_torch_thread")]
TEXTS = ["def f(x):\n    return", "import os\n", "class A:\n    def __init__(self):\n        self.x = 1\n", "x = 1",
         "for i in range(3):", "print('hi')", "y = [a for a in b if a]", "while True:\n"]
VARYING = ("seconds", "share_seconds", "rank", "world_size")  # timing and placement


def make_bundle(d):
    """A tiny 4-head BPD model saved like the bundled one, and 8 prompts of different lengths."""
    return save_bpd_bundle(d, TEXTS)


def comparable(path) -> list[dict]:
    """The records of ``path`` without timing and placement fields."""
    return [{k: v for k, v in json.loads(x).items() if k not in VARYING} for x in open(path, encoding="utf-8")]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("bundle"))


def decode(bundle, *args):
    return main(["decode", "--model", str(bundle / "heads"), "--max-new-tokens", "10", "--tree", "fixed",
                 *map(str, args)])


@pytest.fixture(scope="module")
def full(bundle, tmp_path_factory):
    """An uninterrupted run over every prompt, batch 1, input order."""
    out = tmp_path_factory.mktemp("full") / "out.jsonl"
    assert decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out) == 0
    return out


def test_records_carry_ids_and_fingerprint_and_equal_decode_json(bundle, full, capsys):
    recs = [json.loads(x) for x in full.read_text().splitlines()]
    assert [r["id"] for r in recs] == list(range(1, 9)) and len({r["fingerprint"] for r in recs}) == 1
    assert recs[0]["settings"]["max_new_tokens"] == 10 and recs[0]["settings"]["tree"] == "fixed"
    capsys.readouterr()
    assert decode(bundle, "--prompts", bundle / "prompts.jsonl", "--json") == 0
    plain = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["tokens"] for r in plain] == [r["tokens"] for r in recs]


def test_resume_of_a_complete_output_decodes_nothing_and_keeps_it(bundle, full, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    out.write_bytes(full.read_bytes())
    capsys.readouterr()
    assert decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, "--resume") == 0
    assert out.read_bytes() == full.read_bytes()
    err = capsys.readouterr().err
    assert "nothing left to decode: all 8 prompts already have complete records" in err and "0.00" not in err


def test_resume_redoes_a_torn_line_and_the_missing_prompts(bundle, full, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    lines = full.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:3]) + lines[3][:25])
    assert decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, "--resume") == 0
    assert comparable(out) == comparable(full)
    err = capsys.readouterr().err
    assert "last line is torn" in err and "decoded 5 of 8 prompts (3 already had records)" in err


def _refused(capsys, rc, needle):
    cap = capsys.readouterr()
    last = cap.err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("error: ") and needle in last and "Traceback" not in cap.err, cap.err
    return last


def test_existing_output_and_other_settings_are_refused_leaving_it_as_it_was(bundle, full, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    half = b"".join(full.read_bytes().splitlines(keepends=True)[:4])
    out.write_bytes(half)
    _refused(capsys, decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out), "pass --resume")
    rc = decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, "--resume", "--max-new-tokens", "12")
    last = _refused(capsys, rc, "max_new_tokens 10 there, 12 now")
    assert f"--output {out} line 1" in last
    rc = decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, "--resume", "--k", "8")
    _refused(capsys, rc, "k 16 there, 8 now")
    assert out.read_bytes() == half


@pytest.mark.parametrize("line, why", [('{"prompt": "x = 2"', "line 3: not JSON"),
                                       ('{"prompt": ""}', "line 3: an empty prompt"),
                                       ('{"id": 1, "prompt": "z"}', "line 3: a duplicate id 1 (first on line 1)")])
def test_bad_prompt_lines_are_refused_before_decoding_or_skipped(bundle, full, tmp_path, capsys, line, why):
    src = tmp_path / "in.jsonl"
    good = (bundle / "prompts.jsonl").read_text().splitlines()
    src.write_text("\n".join(good[:2] + [line] + good[2:]) + "\n")
    out = tmp_path / "out.jsonl"
    out.write_bytes(full.read_bytes().splitlines(keepends=True)[0])
    kept = out.read_bytes()
    _refused(capsys, decode(bundle, "--prompts", src, "--output", out, "--resume"), why)
    assert out.read_bytes() == kept
    assert decode(bundle, "--prompts", src, "--output", out, "--resume", "--skip-bad") == 0
    err = capsys.readouterr().err
    assert f"skipped 1 bad line(s): {why.replace(': ', ' (', 1)}" in err
    got = comparable(out)  # the good lines after the bad one have ids one higher (their line numbers)
    want = comparable(full)
    for r in want[2:]:
        r["id"] += 1
    assert got == want


def test_sort_by_length_batches_keep_the_input_order(bundle, full, tmp_path):
    out = tmp_path / "out.jsonl"
    assert decode(bundle, "--prompts", bundle / "prompts.jsonl", "--output", out, "--batch-size", "3",
                  "--sort-by-length") == 0
    assert comparable(out) == comparable(full)


def test_stdin_to_stdout(bundle, full, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((bundle / "prompts.jsonl").read_bytes())))
    capsys.readouterr()
    assert decode(bundle, "--prompts", "-", "--output", "-", "--batch-size", "3", "--sort-by-length") == 0
    got = [{k: v for k, v in json.loads(x).items() if k not in VARYING} for x in capsys.readouterr().out.splitlines()]
    assert got == comparable(full)


@pytest.mark.parametrize("args, needle", [
    (["--prompt", "x", "--resume"], "--resume does not apply here"),
    (["--prompt", "x", "--output", "o.jsonl"], "--output needs --prompts"),
    (["--prompts", "p.jsonl", "--output", "o.jsonl", "--json"], "--json does not apply here"),
    (["--prompts", "p.jsonl", "--json", "--sort-by-length"], "--sort-by-length does not apply here"),
    (["--prompts", "-", "--output", "-", "--resume"], "--resume needs --output FILE"),
    (["--prompts", "p.jsonl", "--output", "p.jsonl"], "--output p.jsonl is the --prompts file"),
])
def test_dataset_options_are_checked_before_loading(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"prompt": "x"}\n')))
    _refused(capsys, main(["decode", "--model", str(tmp_path / "no-model"), *args]), needle)
    assert not (tmp_path / "o.jsonl").exists()


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_per_rank_or_rank_0_only():
    for world, quiet, shown in ((World(1, 2, 1), False, True), (World(1, 2, 1), True, False),
                                (World(0, 2, 0), True, True)):
        f = _Tty()
        bar = progress_bar(world, total=10, initial=4, quiet_ranks=quiet, file=f)
        bar.update(2)
        bar.set_postfix_str("12.0 tok/s")
        bar.close()
        assert (f"rank {world.rank}/2" in f.getvalue() and "6/10" in f.getvalue()) == shown, f.getvalue()
    f = io.StringIO()  # not a terminal: no bar
    progress_bar(World(), total=3, initial=0, quiet_ranks=False, file=f).close()
    assert f.getvalue() == ""


def test_eval_records_per_rank_and_total(full, tmp_path, capsys):
    from latticedraft.decoding.runs.rank_summary import read_records, summarize

    two = tmp_path / "two.jsonl"  # the same records, as if ranks 0 and 1 had split them
    recs = [json.loads(x) for x in full.read_text().splitlines()]
    for i, r in enumerate(recs):
        r.update(rank=i % 2, world_size=2, share_seconds=0.5 if i % 2 else 0.25)
    two.write_text("".join(json.dumps(r) + "\n" for r in recs))
    s = summarize(read_records(two))
    tokens = sum(len(r["tokens"]) for r in recs)
    assert s["ranks"][0]["prompts"] == s["ranks"][1]["prompts"] == 4 and s["ranks"][1]["seconds"] == 2.0
    assert s["total"]["tokens"] == tokens and s["total"]["seconds"] == 2.0 and s["total"]["tokens_per_s"] == tokens / 2
    assert s["total"]["block_efficiency"] == round(tokens / sum(r["calls"] for r in recs), 4)
    capsys.readouterr()
    assert main(["eval", "--records", str(two), "--out", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    assert "| 1 | 4 |" in out and "all (2 rank(s)" in out and (tmp_path / "e" / "records.json").is_file()
    two.write_text(two.read_text() + json.dumps({**recs[0], "id": 99, "fingerprint": "other"}) + "\n")
    _refused(capsys, main(["eval", "--records", str(two)]), "line 9 has fingerprint other")
    _refused(capsys, main(["eval", "--records", str(full), "--k", "3"]), "--k does not apply here")


@pytest.mark.parametrize("args, needle", [(["--prompts", "-", "--output", "o.jsonl"], "--prompts - under a launcher"),
                                          (["--prompts", "p.jsonl", "--output", "-"], "--output - under a launcher")])
def test_standard_streams_are_refused_under_a_launcher(tmp_path, capsys, monkeypatch, args, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    _refused(capsys, main(["decode", "--model", str(tmp_path / "no-model"), *args]), needle)
