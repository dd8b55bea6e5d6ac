"""``bpd_session.acceptance_key``: what cached acceptance rates are fitted for."""

import torch

from latticedraft.decoding.methods.bpd import DrafterSpec
from latticedraft.decoding.methods.bpd_session import acceptance_key
from latticedraft.decoding.runs.session import Session
from tests.decoding.tiny import tiny_model


def test_rates_fitted_in_one_dtype_are_not_reused_in_another():
    spec, prompts = DrafterSpec("none"), ["def f(x):"]
    f32 = acceptance_key(Session(model=tiny_model("llama", vocab=8192)), spec, [], prompts)
    bf16 = acceptance_key(Session(model=tiny_model("llama", dtype=torch.bfloat16, vocab=8192)), spec, [], prompts)
    assert f32["dtype"] == "torch.float32" and bf16["dtype"] == "torch.bfloat16"
    assert {k: v for k, v in f32.items() if k != "dtype"} == {k: v for k, v in bf16.items() if k != "dtype"}
    assert acceptance_key(Session(model=tiny_model("llama", vocab=8192)), spec, [], prompts) == f32
    assert acceptance_key(Session(model=tiny_model("llama", vocab=8192)), spec, [], ["other"]) != f32
