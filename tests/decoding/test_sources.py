"""The draft-source registry: every source is declared once, and from that declaration come its
option, range check, fingerprint, cache key, rate table and the docs' table; a source added as
docs/architecture.md says (its module and one name) decodes exactly with no other edit."""

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from latticedraft.decoding import sources
from latticedraft.decoding.methods import bpd
from latticedraft.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_table_is_the_registrys():
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = re.search(r"<!-- sources:begin -->\n(.*?)\n<!-- sources:end -->", page, re.S).group(1)
    assert table == sources.markdown_table()


@pytest.mark.parametrize("dest", ["context_ngrams", "lm_drafts", "suffix_drafts"])
def test_a_sources_option_is_named_in_at_most_3_package_files(dest):
    """Its own module, and at most two mentions elsewhere (the option is derived, never listed)."""
    files = [p for p in (ROOT / "latticedraft").rglob("*.py") if dest in p.read_text()]
    assert len(files) <= 3, (dest, files)


def test_each_declaration_gives_the_option_check_and_fingerprint():
    for s in sources.sources():
        assert s.dest in {f.name for f in bpd.DrafterSpec.__dataclass_fields__.values()}
        assert s.dest in bpd.METHOD.options
        assert s.dest in bpd._settings(bpd.DrafterSpec("none"), None)
    with pytest.raises(InputError, match="--context-ngrams -1"):
        bpd.METHOD.configure({"context_ngrams": -1}, {"context_ngrams"})
    with pytest.raises(InputError, match="--self-draft 'int2' is not one of"):
        bpd.METHOD.configure({"self_draft": "int2"}, {"self_draft"})


MODULE = '''
import numpy as np
from latticedraft.decoding.proposers.base import Proposal, Proposer
from latticedraft.decoding.registry import option
from latticedraft.decoding.sources import DraftSource
from latticedraft.errors import InputError


class RepeatRoot(Proposer):
    """Drafts the root token again, n times: right only where the text repeats itself."""
    name = "repeat"
    admits = True

    def __init__(self, n):
        self.n = n

    def paths(self, history):
        return [(np.full(self.n, history[-1], dtype=np.int64), np.full(self.n, 7, dtype=np.int64))]

    def propose(self, step):
        from latticedraft.decoding.proposers.base import rated
        return [rated(self.paths(h), step.acceptance, "repeat") for h in step.histories]


def _check(value):
    if int(value) < 0:
        raise InputError(f"--repeat-drafts {value}: give a number of tokens >= 0")
    return int(value)


SOURCE = DraftSource(name="repeat", dest="repeat_drafts", summary="the root again",
                     option=option(0, group="tree", type=int, metavar="N", help="also draft the root N times"),
                     build=lambda session, value: RepeatRoot(value), check=_check)
'''


SCRIPT = """
import sys, types
mod = types.ModuleType("latticedraft.decoding.proposers.repeat_drafts")
exec(MODULE, mod.__dict__)
sys.modules[mod.__name__] = mod
from latticedraft.decoding import sources
sources.MODULES = (*sources.MODULES, "repeat_drafts")      # the one registration line
from latticedraft.decoding.methods import bpd
from latticedraft.decoding.methods.bpd_loop import BpdPlan, bpd_decode
from latticedraft.decoding.registry import Request
from latticedraft.errors import InputError
from tests.decoding.tiny import prompts, reference, tiny_model

spec = bpd.METHOD.configure({"drafter": "none", "repeat_drafts": 3}, {"repeat_drafts"})
assert spec.repeat_drafts == 3 and bpd._settings(spec, None)["repeat_drafts"] == 3
try:
    bpd.METHOD.configure({"repeat_drafts": -2}, {"repeat_drafts"})
    raise SystemExit("not refused")
except InputError as e:
    assert "--repeat-drafts -2" in str(e)
assert "| repeat: the root again | `--repeat-drafts` | `0` |" in sources.markdown_table()
from latticedraft.cli import build_parser
assert build_parser().parse_args(["decode", "--prompt", "x", "--repeat-drafts", "2"]).repeat_drafts == 2
model = tiny_model("llama")
ps = prompts(2, seed=3)
src = sources.by_name("repeat").build(None, 3)
r = bpd_decode(model, ps, None, BpdPlan(sources=(src,)), Request(max_new_tokens=12))
assert [s.tokens.tolist() for s in r.sequences] == [reference(model, p, 12) for p in ps]
print("ok")
"""


def test_a_source_added_by_the_recipe_decodes_exactly():
    """A module with a proposer and SOURCE, plus its name in MODULES (in a fresh process): the
    option parses and is checked, the spec and fingerprint carry it, the docs table lists it, and
    a decode with its paths equals generate."""
    import subprocess

    p = subprocess.run([sys.executable, "-c", f"MODULE = {MODULE!r}\n" + SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-2000:]
