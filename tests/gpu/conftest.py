"""Tiny random HF causal LMs of four architectures, built in the test (no downloads)."""

from __future__ import annotations

import pytest
import torch

V = 97


def make_tiny(arch: str, vocab: int = V, hidden: int = 32, seed: int = 0):
    from transformers import (GPT2Config, GPT2LMHeadModel, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig,
                              LlamaForCausalLM, MistralConfig, MistralForCausalLM)

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=64)
    if arch == "gpt2":
        m = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=hidden, n_layer=2, n_head=2,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    elif arch == "llama":
        m = LlamaForCausalLM(LlamaConfig(num_key_value_heads=2, **common))
    elif arch == "mistral":
        m = MistralForCausalLM(MistralConfig(num_key_value_heads=2, sliding_window=8, **common))
    elif arch == "neox":
        m = GPTNeoXForCausalLM(GPTNeoXConfig(**common))
    else:
        raise ValueError(arch)
    return m.eval()


ARCHS = ["gpt2", "llama", "mistral", "neox"]


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture(params=["stern", "medusa", "dynamo"])
def kind(request):
    return request.param


def perturb_heads(bm, seed: int = 1, scale: float = 0.2) -> None:
    """Give heads 2..h distinct random weights (fresh heads all copy head 1, which would hide bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in bm.head_parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
