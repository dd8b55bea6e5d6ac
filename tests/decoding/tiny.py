"""Tiny random HF causal LMs and a heads wrapper for decoding tests (no downloads).

``ToyHeads`` has the ``BlockwiseModel`` calling convention (``forward(..., heads=True)`` ->
``.logits``, ``.head_logits [b, s, h, V]`` with head 0 = the base logits) so the loop and
verifiers are tested before, and independently of, the trained heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from latticedraft.gpu.models import hf

VOCAB = 64


def tiny_model(arch: str = "gpt2", dtype=torch.float32, seed: int = 0, vocab: int = VOCAB, attn: str = "sdpa",
               layers: int = 2, window: int = 7):
    torch.manual_seed(seed)
    if arch == "gpt2":
        cfg = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=32, n_layer=layers, n_head=4)
        m = GPT2LMHeadModel(cfg)
    elif arch == "llama":
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        m = LlamaForCausalLM(cfg)
    elif arch == "qwen2":  # LLaMA's layers with biased q, k, v projections
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
        m = Qwen2ForCausalLM(cfg)
    elif arch == "mistral":
        cfg = MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                            sliding_window=window)
        m = MistralForCausalLM(cfg)
    else:
        raise ValueError(arch)
    m.config._attn_implementation = attn
    return m.to(dtype).eval()


@dataclass
class ToyOutput:
    logits: torch.Tensor
    head_logits: torch.Tensor
    hidden: torch.Tensor
    cache: object


class ToyHeads(torch.nn.Module):
    """h - 1 random linear heads on the base's last hidden state (head 0 = the base LM)."""

    def __init__(self, base, num_heads: int = 4, seed: int = 1):
        super().__init__()
        self.base = base
        self.num_heads = num_heads
        self.kind = "toy"
        g = torch.Generator().manual_seed(seed)
        H = base.config.hidden_size if hasattr(base.config, "hidden_size") else base.config.n_embd
        V = base.config.vocab_size
        dt = next(base.parameters()).dtype
        self.heads = torch.nn.Parameter(torch.randn(num_heads - 1, H, V, generator=g).to(dt) * 0.5)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, heads=True, **kw):
        cache = kw.pop("past_key_values", cache)  # the name callers use under transformers < 5.24 (hf.cache_keyword)
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        use_cache=use_cache, output_hidden_states=True, **hf.cache_arg(cache), **kw)
        hid = out.hidden_states[-1]
        extra = torch.einsum("bsh,khv->bskv", hid, self.heads)
        hl = torch.cat([out.logits[:, :, None, :], extra], dim=2) if heads else None
        return ToyOutput(out.logits, hl, hid, hf.output_cache(out))

    def head_logits_from(self, out, positions):
        pos = torch.as_tensor(positions, dtype=torch.long).reshape(-1)
        hid = out.hidden[:, pos]
        extra = torch.einsum("bsh,khv->bskv", hid, self.heads)
        return torch.cat([out.logits[:, pos, None, :], extra], dim=2)


def reference(model, prompt, max_new_tokens, eos=None):
    """model.generate(do_sample=False) for one prompt, cut after the first EOS."""
    base = getattr(model, "base", model)
    ids = torch.as_tensor(np.asarray(prompt, dtype=np.int64)[None])
    g = base.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                      eos_token_id=eos, pad_token_id=0)
    toks = g[0, ids.shape[1]:].tolist()
    if eos is not None and eos in toks:
        toks = toks[: toks.index(eos) + 1]
    return toks


def sampled_reference(model, prompt, max_new_tokens, opts, row: int = 0):
    """Plain sampling of ``prompt`` by row ``row`` of a run with ``opts`` (``SamplingOptions``):
    one full forward per token; the token at position t is the argmax of log p + the row's Gumbel
    noise at t (``accept.sampling``), p after generate's processors. What every lossless decoder
    must emit under sampling, token for token."""
    from latticedraft.decoding.accept.sampling import GumbelNoise

    base, noise, ids = getattr(model, "base", model), GumbelNoise(opts.seed), [int(t) for t in prompt]
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = base(torch.as_tensor([ids])).logits[:, -1]
        ctx = [np.asarray(ids)] if opts.repetition_penalty != 1.0 else None
        p = opts.probs(logits, ctx)[0]
        ids.append(noise.choice(p, row, len(ids)))
    return ids[len(prompt):]


def prompts(n: int, seed: int = 0, lengths=(3, 9, 5, 14), vocab: int = VOCAB):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=lengths[i % len(lengths)]).astype(np.int64) for i in range(n)]


def blockwise(arch: str = "gpt2", dtype=torch.float32, num_heads: int = 4, seed: int = 0, noise: float = 0.5,
              window: int = 7):
    """A real ``BlockwiseModel`` (Stern heads) on a tiny random base (Mistral: sliding ``window``);
    the heads are perturbed so that they disagree with each other and the drafts differ from step to step."""
    from latticedraft.gpu.models.blockwise import BlockwiseModel

    m = BlockwiseModel.from_base(tiny_model(arch, dtype, seed, window=window), num_heads, kind="stern", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for prm in m.heads.parameters():
            prm.add_(torch.randn(prm.shape, generator=g).to(prm.dtype) * noise)
    return m.eval()


def save_bpd_bundle(d, texts, rescorer: bool = False, noise: float = 0.3):
    """A tiny 4-head BPD model saved in ``d`` like the bundled one (``heads/`` naming ``../base``),
    its heads perturbed by ``noise``; ``resc/`` a tiny rescorer if asked; ``prompts.jsonl`` of
    ``texts``. Returns ``d``."""
    import json

    from transformers import GPT2Config, GPT2LMHeadModel

    from latticedraft.gpu.models.blockwise import BlockwiseModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=256, n_embd=16, n_layer=1, n_head=2)).eval()
    base.save_pretrained(d / "base")
    bm = BlockwiseModel.from_base(base, 4, seed=0)
    with torch.no_grad():
        for p in bm.heads.parameters():
            p.add_(torch.randn_like(p) * noise)
    bm.save_pretrained(d / "heads", base_ref="../base")
    if rescorer:
        GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_positions=256, n_embd=8, n_layer=1, n_head=2)).save_pretrained(d / "resc")
    (d / "prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return d


def bundled_greedy(num_prompts: int = 4, max_new_tokens: int = 32):
    """(Session on the bundled model, the first held-out prompts' ids, their greedy tokens)."""
    from latticedraft.decoding.runs.session import Session
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.paths import data_dir

    s = Session()
    ids = encode(s.tokenizer, [r["prompt"] for r in read_prompts(data_dir() / "prompts.jsonl", limit=num_prompts)])
    return s, ids, [q.tokens for q in s.decode(ids, "greedy", max_new_tokens=max_new_tokens).sequences]
