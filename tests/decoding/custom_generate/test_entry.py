"""``entry``: the bundled base is recognised by its weights (not its path), sessions live on the
model without getting into its copies, and the shared checks' messages name generate's keywords."""


import pytest
import torch

from latticedraft.decoding.custom_generate.entry import as_keywords, is_bundled_base
from latticedraft.paths import data_dir
from tests.decoding.tiny import tiny_model

BASE = data_dir() / "base"


@pytest.mark.skipif(not (BASE / "model.safetensors").is_file(), reason="bundled base missing")
def test_the_bundled_base_is_recognised_by_its_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BASE)
    assert is_bundled_base(base)
    base.save_pretrained(tmp_path / "copy")  # another path, same weights
    assert is_bundled_base(AutoModelForCausalLM.from_pretrained(tmp_path / "copy"))
    assert is_bundled_base(AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float16))  # stored in float16
    with torch.no_grad():
        base.get_input_embeddings().weight[3, 0] += 1.0
    assert not is_bundled_base(base)
    assert not is_bundled_base(tiny_model("mistral", vocab=8192))


@pytest.mark.parametrize("message, keywords", [
    ("--lm does not apply to --drafter top1; drop it", "lm does not apply to drafter top1; drop it"),
    ("--draft-model DIR is needed", "draft_model=DIR is needed"),
    ("--context-ngrams 3 does not apply", "context_ngrams 3 does not apply"),
    ("run `latticedraft lm build --order 4` first (--nbest)", "run `latticedraft lm build --order 4` first (nbest)"),
])
def test_messages_name_keywords_not_flags(message, keywords):
    assert as_keywords(message) == keywords
