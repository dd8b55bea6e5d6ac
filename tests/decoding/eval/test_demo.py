"""The demo's lattice picture: drawn from a pass with a gate of its own, whatever policy the
session's gate has measured its way to."""

import pytest

from latticedraft.decoding.eval.demo import FAST, run_demo
from latticedraft.decoding.planning.head_gate import OFF, HeadGate
from latticedraft.decoding.runs.session import Session
from latticedraft.paths import default_lm_dir
from tests.decoding.tiny import save_bpd_bundle


@pytest.mark.skipif(not default_lm_dir().exists(), reason="bundled 4-gram missing (run scripts/setup.sh)")
def test_the_lattice_picture_is_drawn_when_the_sessions_gate_skips_the_heads(tmp_path):
    d = save_bpd_bundle(tmp_path, ["def f(x):\n    return", "import os\n"])
    s = Session(d / "heads", threads=1)
    off = HeadGate()
    off.policy = OFF  # the session's gate: no heads (as a CPU run measures its way to)
    s.swap_gate(FAST, off)
    summary = run_demo(s, prompts_file=d / "prompts.jsonl", num_prompts=2, max_new_tokens=8,
                       out_dir=tmp_path / "demo", notify=lambda *a: None)
    assert summary["all_exact"] and summary["lattice_png"]
    assert (tmp_path / "demo" / "lattice_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert s.gate(FAST) is off  # the session's gate is back in place, untaught by the picture's pass
