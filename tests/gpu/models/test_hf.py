"""``gpu/models/hf.py``'s cache keyword: every model call passes its KV cache by the name the
installed transformers takes, without its deprecation notice, and reads it back from the output."""

import warnings

import torch
from transformers import DynamicCache

from latticedraft.gpu.models import hf
from tests.decoding.tiny import tiny_model


def test_the_cache_goes_in_and_comes_back_by_the_installed_name_without_a_notice():
    import inspect

    from transformers import LlamaModel

    assert hf.cache_keyword() in inspect.signature(LlamaModel.forward).parameters
    model = tiny_model("llama")
    cache = DynamicCache()
    ids = torch.tensor([[5, 9, 2, 7]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated keyword would raise here
        out = model(input_ids=ids, use_cache=True, **hf.cache_arg(cache))
        again = model(input_ids=ids[:, -1:], use_cache=True, **hf.cache_arg(hf.output_cache(out)))
    assert hf.output_cache(out) is cache and cache.get_seq_length() == 5
    full = model(input_ids=torch.cat([ids, ids[:, -1:]], dim=1)).logits[:, -1]
    torch.testing.assert_close(again.logits[:, -1], full)
