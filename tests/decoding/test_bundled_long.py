"""A 1 500-token held-out prompt on the bundled long-context model: BPD (rolling cache, chunked
prefill) and lookahead emit HF greedy's tokens. Skipped until the bundled base has the positions
(the Mistral base of ``data/build.py``: 2 048 positions, window 256)."""

import numpy as np
import pytest
import torch

from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.runs.loaders import default_model_dir
from latticedraft.gpu.train.data import encode_files
from latticedraft.gpu.verify.modes import position_limit, sliding_window
from latticedraft.lm.corpus import stdlib_split

PROMPT, NEW = 1500, 24


def _base_limit():
    import json

    from latticedraft.paths import data_dir

    cfg = data_dir() / "base" / "config.json"
    if not cfg.is_file():
        return 0
    c = json.loads(cfg.read_text())
    return c.get("max_position_embeddings") or c.get("n_positions") or 0


pytestmark = [pytest.mark.skipif(_base_limit() < PROMPT + NEW or not (default_model_dir() / "heads_config.json").exists(),
                                 reason="the bundled base has fewer than 1 524 positions (build the long-context "
                                        "base: bash data/build.sh base heads-stern)"),
              pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def test_bundled_1500_token_prompt_equals_hf_greedy():
    from latticedraft.decoding.runs.session import Session

    s = Session()
    assert sliding_window(s.model) and position_limit(s.model) >= PROMPT + NEW
    held = encode_files(stdlib_split("heldout"), s.tokenizer)
    prompt = np.asarray(held[5000:5000 + PROMPT], dtype=np.int64)
    x = torch.as_tensor(prompt[None])
    ref = s.model.base.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=NEW,
                                pad_token_id=0)[0, PROMPT:].numpy()
    for spec in (DrafterSpec("top1").fast(), DrafterSpec("parallel-base", nbest=8, slots=3)):
        res = s.decode([prompt], "bpd", spec, max_new_tokens=NEW)
        assert np.array_equal(res.sequences[0].tokens, ref) and res.verify_mode == "tree"
    look = s.decode([prompt], "lookahead", max_new_tokens=NEW)
    assert np.array_equal(look.sequences[0].tokens, ref)
