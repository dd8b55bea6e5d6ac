"""A tiny GGUF file written here, as llama.cpp writes one (no downloads): a 2-layer Llama (hidden 32,
4 heads, 2 key/value heads, untied output) with random float32 weights, and a byte-level BPE
("gpt2" tokenizer model) of ``VOCAB`` tokens trained here, with ChatML special tokens and template.

``write_tiny_gguf(path)`` returns the reference it was made from: the HF model whose weights the file
holds (q/k permuted as llama.cpp's convert_hf_to_gguf.py permutes them) and the ``tokenizers`` BPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|pad|>", "<|im_end|>"]  # ids 0..3
BOS, PAD, EOS = 1, 2, 3  # none of LlamaConfig's defaults (bos 1 aside), so a match proves the file's ids were read
VOCAB = 320  # 4 specials + 256 bytes + 60 merges
RMS_EPS = 2.0 ** -17  # exact in float32, as GGUF stores it
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
          "import os\nimport sys\n", "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"] * 20


@dataclass
class TinyGGUF:
    path: Path
    model: object  # transformers LlamaForCausalLM, float32, eval
    tokenizer: object  # tokenizers.Tokenizer

    @property
    def tokens(self) -> list[str]:
        vocab = self.tokenizer.get_vocab()
        return sorted(vocab, key=vocab.get)


def train_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == VOCAB
    return tok


def reference_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      rms_norm_eps=RMS_EPS, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():  # norms away from 1 too, so a misplaced norm weight shows
            p.copy_(torch.randn_like(p) * (0.1 if p.ndim > 1 else 0.3) + (1.0 if p.ndim == 1 else 0.0))
    return m


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k permutation (convert_hf_to_gguf.py, LlamaModel.permute) for ``n_head`` heads."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(m) -> dict[str, np.ndarray]:
    sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()}
    c = m.config
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
                f"blk.{i}.attn_q.weight": _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads),
                f"blk.{i}.attn_k.weight": _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads),
                f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
                f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
                f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
                f"blk.{i}.ffn_gate.weight": sd[p + "mlp.gate_proj.weight"],
                f"blk.{i}.ffn_up.weight": sd[p + "mlp.up_proj.weight"],
                f"blk.{i}.ffn_down.weight": sd[p + "mlp.down_proj.weight"]}
    return out


def write_tiny_gguf(path, arch: str = "llama", pad: bool = True, seed: int = 0) -> TinyGGUF:
    """Write the tiny GGUF to ``path`` (``arch``: its ``general.architecture``, e.g. one transformers
    cannot read; ``pad``: whether it names a padding id); returns its reference."""
    import gguf

    path = Path(path)
    model, tok = reference_model(seed), train_bpe()
    c = model.config
    tokens = TinyGGUF(path, model, tok).tokens
    merges = [" ".join(pair) for pair in _merges(tok)]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny test llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3: control, 1: normal
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    if pad:
        w.add_pad_token_id(PAD)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, t in _tensors(model).items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGGUF(path, model, tok)


def _merges(tok) -> list[tuple[str, str]]:
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
