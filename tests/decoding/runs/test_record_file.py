"""Record files of ``decode --output``: fingerprints, torn tails, merging (issue 13)."""

import json

import pytest

from latticedraft.decoding.runs import record_file as rf
from latticedraft.errors import InputError

SETTINGS = {"method": "bpd", "max_new_tokens": 12, "k": 16}


def _rec(i, settings=SETTINGS, **kw):
    return {"id": i, "fingerprint": rf.fingerprint(settings), "tokens": [i], "settings": settings, **kw}


def _write(path, recs, tail=b""):
    path.write_bytes(b"".join((json.dumps(r) + "\n").encode() for r in recs) + tail)


def test_fingerprint_is_canonical_and_names_what_differs():
    assert rf.fingerprint({"a": 1, "b": 2}) == rf.fingerprint({"b": 2, "a": 1}) != rf.fingerprint({"a": 1, "b": 3})
    assert rf.describe_difference({"k": 16, "x": 1}, {"k": 8, "x": 1}) == "k 16 there, 8 now"


def test_scan_finds_complete_records_and_a_torn_tail(tmp_path):
    f = tmp_path / "out.jsonl"
    _write(f, [_rec(1), _rec("b")], tail=b'{"id": 3, "finger')
    s = rf.scan(f, SETTINGS)
    assert s.order == [1, "b"] and s.torn and s.complete_bytes == len(f.read_bytes()) - len(b'{"id": 3, "finger')
    w = rf.RecordWriter(f, s)  # cuts the torn tail, then appends
    w.append(_rec(3))
    w.close()
    assert rf.scan(f, SETTINGS).order == [1, "b", 3] and not rf.scan(f, SETTINGS).torn
    assert rf.scan(tmp_path / "missing.jsonl", SETTINGS).order == []
    rf.RecordWriter(tmp_path / "new" / "dir" / "out.jsonl").close()  # no record: nothing is made
    assert not (tmp_path / "new").exists()
    w = rf.RecordWriter(tmp_path / "new" / "dir" / "out.jsonl")
    w.append(_rec(1))  # the first record makes the directory and the file
    w.close()
    assert rf.scan(tmp_path / "new" / "dir" / "out.jsonl", SETTINGS).order == [1]


@pytest.mark.parametrize("bad, needle", [
    ("not json", "line 2 is not JSON (Expecting value at column 1), not a record, though the line(s) before it are"),
    (json.dumps(_rec(1)), "line 2 repeats the record of prompt id 1"),
    (json.dumps(_rec(2, {**SETTINGS, "max_new_tokens": 16})), "max_new_tokens 16 there, 12 now"),
])
def test_scan_refuses_lines_it_cannot_keep(tmp_path, bad, needle):
    f = tmp_path / "out.jsonl"
    _write(f, [_rec(1)], tail=bad.encode() + b"\n")
    before = f.read_bytes()
    with pytest.raises(InputError, match="--output") as e:
        rf.scan(f, SETTINGS)
    assert needle in str(e.value) and f.read_bytes() == before


def test_merge_orders_by_prompt_keeps_unknown_ids_and_removes_parts(tmp_path):
    out = tmp_path / "out.jsonl"
    _write(out, [_rec(3), _rec("old")])
    p0, p1 = rf.part_path(out, 0, 2), rf.part_path(out, 1, 2)
    _write(p0, [_rec(2), _rec(3)], tail=b'{"id": 1')  # 3 also in OUT (a crash after the last merge); 1 torn
    _write(p1, [_rec(1)])
    assert rf.part_files(out) == [p0, p1]
    lines = {i: (json.dumps(_rec(i)) + "\n").encode() for i in (1, 2, 3, "old")}
    n, extra = rf.merge(out, [rf.scan(p, SETTINGS) for p in (out, p0, p1)], [1, 2, 3])
    assert (n, extra) == (4, ["old"]) and rf.part_files(out) == []
    assert out.read_bytes() == lines[1] + lines[2] + lines[3] + lines["old"]
