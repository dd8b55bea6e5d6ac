"""Quiet by default: the CLI's stderr carries no library warning, deprecation notice or load report;
``--verbose`` shows them; a config/weights mismatch is our one-line error."""

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from latticedraft.paths import data_dir
from latticedraft.quiet import quiet_libraries

ROOT = Path(__file__).resolve().parent.parent
BASE = data_dir() / "base"
NOISE = ("Warning", "deprecated", "LOAD REPORT")


def _cli(*args):
    """``python -m latticedraft ARGS`` in a fresh process (warnings are per process): (status, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "latticedraft", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(Path.home())})
    return p.returncode, p.stdout, p.stderr


def test_library_warnings_hidden_then_shown_again():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_libraries()
        warnings.warn_explicit("`past_key_values` is deprecated", FutureWarning, "output_capturing.py", 1,
                               module="transformers.utils.output_capturing")
        warnings.warn_explicit("a torch notice", UserWarning, "x.py", 1, module="torch.nn.modules")
        warnings.warn_explicit("ours", UserWarning, "x.py", 1, module="latticedraft.lattice.sausage")
        assert [str(w.message) for w in seen] == ["ours"]
        quiet_libraries(verbose=True)
        warnings.warn_explicit("a torch notice", UserWarning, "x.py", 1, module="torch.nn.modules")
        assert [str(w.message) for w in seen] == ["ours", "a torch notice"]


@pytest.mark.skipif(not (BASE / "model.safetensors").is_file(), reason="bundled model missing")
def test_decode_on_the_bundled_model_prints_no_library_notice():
    rc, out, err = _cli("decode", "--prompt", "import os", "--max-new-tokens", "8", "--threads", "1")
    assert rc == 0 and out.startswith("import os")
    assert not [line for line in err.splitlines() if any(n in line for n in NOISE)], err
    assert "block efficiency" in err  # our own summary line stays


@pytest.mark.skipif(not (BASE / "model.safetensors").is_file(), reason="bundled model missing")
def test_config_weights_mismatch_is_one_line_and_verbose_shows_the_report(tmp_path):
    bad = tmp_path / "base"
    shutil.copytree(BASE, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    (bad / "config.json").write_text(json.dumps(cfg))
    rc, out, err = _cli("decode", "--model", bad, "--prompt", "import os", "--max-new-tokens", "4", "--threads", "1")
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith(f"error: model directory {bad} lacks weights its config.json describes")
    rc, _, err = _cli("--verbose", "decode", "--model", bad, "--prompt", "import os", "--max-new-tokens", "4")
    assert rc == 2 and "LOAD REPORT" in err and err.strip().splitlines()[-1].startswith("error: ")


def test_what_libraries_write_to_stderr_themselves_is_dropped_only_while_quiet(capsys):
    """``libraries_speaking``: transformers' GGUF bars are plain tqdm on stderr, past every setting."""
    from tqdm.auto import tqdm

    from latticedraft import quiet
    from latticedraft.quiet import libraries_speaking

    was_quiet = quiet._hidden
    try:
        for verbose in (False, True):
            quiet_libraries(verbose=verbose)
            with libraries_speaking():
                for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
                    pass
            assert ("Converting" in capsys.readouterr().err) == verbose
    finally:
        quiet_libraries(verbose=not was_quiet)
