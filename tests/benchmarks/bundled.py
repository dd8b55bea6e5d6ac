"""What the benchmark tests share: ``benchmarks/`` importable, and the skip mark for a checkout whose
bundled models are not built yet (``bash scripts/setup.sh`` builds the 4-gram)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from latticedraft.decoding.runs.loaders import default_model_dir
from latticedraft.paths import default_lm_dir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

READY = (default_model_dir() / "heads_config.json").is_file() and (default_lm_dir() / "manifest.json").is_file()
MARKS = [pytest.mark.skipif(not READY, reason="bundled models not built (bash scripts/setup.sh)"),
         pytest.mark.usefixtures("one_torch_thread")]
