"""Killed runs of ``decode --output`` (issue 13): SIGKILL part-way, then ``--resume``, gives the
records of an uninterrupted run (tokens and every other field; timing and placement excluded),
in one process and under ``torchrun --nproc_per_node 2`` (gloo on CPU).

The run is a subprocess whose ``record_file._write_all`` is wrapped to SIGKILL its own process
at the N-th record: after writing it, or half-way through it (a torn line).
"""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from latticedraft.decoding.runs.shards import shard_of
from tests.decoding.runs.test_dataset import TEXTS, TOKENIZER, comparable, make_bundle

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not TOKENIZER.is_file(), reason="bundled tokenizer missing (run scripts/setup.sh)")
KILLER = """
import os, signal, sys
from latticedraft.decoding.runs import record_file
real, seen = record_file._write_all, [0]
at, how = int(os.environ["KILL_AT_RECORD"]), os.environ["KILL_HOW"]
mine = os.environ.get("RANK", "0") == os.environ.get("KILL_RANK", "0")
def write_all(fd, data):
    seen[0] += 1
    if mine and seen[0] == at:
        real(fd, data if how == "after" else data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    real(fd, data)
record_file._write_all = write_all
from latticedraft.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = make_bundle(tmp_path_factory.mktemp("bundle"))
    (d / "killer.py").write_text(KILLER)
    return d


def args(bundle, out, *more):
    return ["decode", "--model", str(bundle / "heads"), "--prompts", str(bundle / "prompts.jsonl"), "--output",
            str(out), "--max-new-tokens", "10", "--tree", "fixed", "--batch-size", "2", "--threads", "1", *more]


def env(**kw):
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **kw}


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, env=env(**kw), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def reference(setup, tmp_path_factory):
    from latticedraft.cli import main

    out = tmp_path_factory.mktemp("ref") / "out.jsonl"
    assert main(args(setup, out)) == 0
    return out


@pytest.mark.parametrize("at, how", [(3, "after"), (4, "during")])
def test_sigkill_then_resume_equals_an_uninterrupted_run(setup, reference, tmp_path, capsys, at, how):
    from latticedraft.cli import main

    out = tmp_path / "out.jsonl"
    r = run([sys.executable, str(setup / "killer.py"), *args(setup, out)], KILL_AT_RECORD=str(at), KILL_HOW=how)
    assert r.returncode == -signal.SIGKILL, r.stderr
    data = out.read_bytes()
    done = data.count(b"\n")
    assert done == (at if how == "after" else at - 1) and data.endswith(b"\n") == (how == "after")
    capsys.readouterr()
    assert main(args(setup, out, "--resume")) == 0  # (in this process: the resume needs no kill)
    err = capsys.readouterr().err
    assert f"decoded {len(TEXTS) - done} of {len(TEXTS)} prompts" in err
    assert ("last line is torn" in err) == (how == "during")
    assert comparable(out) == comparable(reference)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script_or_module: list[str], cli: list[str], **kw):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), *script_or_module, *cli]
    return run(cmd, **kw)


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process_also_after_killing_a_rank(setup, reference, tmp_path):
    ranks = [shard_of(i, 2) for i in range(1, len(TEXTS) + 1)]
    assert ranks.count(1) >= 2 and ranks.count(0) >= 2  # each rank has part of the work
    out = tmp_path / "all.jsonl"
    r = torchrun(["-m", "latticedraft"], args(setup, out, "--sort-by-length"))
    assert r.returncode == 0, r.stderr
    assert comparable(out) == comparable(reference)
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["rank"] for x in recs] == ranks and {x["world_size"] for x in recs} == {2}
    assert not list(tmp_path.glob("all.jsonl.part-*"))

    out = tmp_path / "killed.jsonl"
    r = torchrun([str(setup / "killer.py")], args(setup, out), KILL_AT_RECORD="2", KILL_HOW="during", KILL_RANK="1")
    assert r.returncode != 0 and not out.exists()
    part1 = tmp_path / "killed.jsonl.part-1-of-2"
    assert part1.read_bytes().count(b"\n") == 1 and not part1.read_bytes().endswith(b"\n")  # torn second record
    r = torchrun(["-m", "latticedraft"], args(setup, out, "--resume"))
    assert r.returncode == 0, r.stderr
    assert "last line is torn" in r.stderr and "rank 1/2: decoded" in r.stderr
    assert comparable(out) == comparable(reference)
    assert not list(tmp_path.glob("killed.jsonl.part-*"))
