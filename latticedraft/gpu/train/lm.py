"""Training a small causal LM from scratch (``train_lm``): the bundled base and draft models.

Runs the loop in ``loop.py`` (AdamW β = (0.9, 0.95), ε = 1e-8, cosine schedule with 1% warm-up,
gradient accumulation, atomic checkpoints, exact ``--resume``, a stop on NaN).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch

from latticedraft.errors import InputError
from latticedraft.outputs import TRAINED_LM, claim_dir
from latticedraft.gpu.train.data import TokenWindows, encode_files, quiet_hf_progress
from latticedraft.gpu.train.loop import (
    OptimConfig,
    TrainResult,
    finish_dir,
    run_training,
    write_json_atomic,
)


@dataclass
class LMArch:
    """A small causal LM, tied embeddings, no dropout.

    ``family="gpt2"``: GPT-2 (learned absolute positions, GELU MLP of 4 × ``n_embd``).
    ``family="mistral"``: Mistral (RoPE, RMSNorm, SwiGLU MLP of ``ffn_dim``, sliding-window attention
    over the last ``sliding_window`` positions; ``None`` means full causal attention).
    """

    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_positions: int = 256
    family: str = "gpt2"
    sliding_window: int | None = None
    ffn_dim: int | None = None  # Mistral only; default 8/3 × n_embd rounded up to a multiple of 8

    @property
    def ffn(self) -> int:
        """The MLP width: 4 × ``n_embd`` (gpt2), ``ffn_dim`` or 8/3 × ``n_embd`` rounded up to a multiple of 8 (mistral)."""
        if self.family == "gpt2":
            return 4 * self.n_embd
        return self.ffn_dim or -(-8 * self.n_embd // 3 // 8) * 8

    def check(self, seq_len: int) -> None:
        """``InputError`` naming the option when the sizes do not make a model (or ``seq_len`` exceeds its context)."""
        for flag, v in (("--n-embd", self.n_embd), ("--n-layer", self.n_layer), ("--n-head", self.n_head),
                        ("--n-positions", self.n_positions)):
            if v < 1:
                raise InputError(f"{flag} {v} must be at least 1")
        if self.family not in ("gpt2", "mistral"):
            raise InputError(f"--family {self.family!r} is not known; choose gpt2 or mistral")
        if seq_len > self.n_positions:
            raise InputError(f"--seq-len {seq_len} exceeds the model's context --n-positions {self.n_positions}; "
                             f"lower --seq-len or raise --n-positions")
        if self.n_embd % self.n_head:
            raise InputError(f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}")
        if self.sliding_window is not None:
            if self.family != "mistral" or self.sliding_window < 1:
                raise InputError(f"--sliding-window {self.sliding_window} needs --family mistral and a window of at "
                                 "least 1")
            if self.sliding_window > self.n_positions:
                raise InputError(f"--sliding-window {self.sliding_window} exceeds the context --n-positions "
                                 f"{self.n_positions} (such a window is full attention); lower it or drop it")
        if self.ffn_dim is not None and (self.family != "mistral" or self.ffn_dim < 1):
            raise InputError(f"--ffn-dim {self.ffn_dim} needs --family mistral (GPT-2's MLP is 4 x --n-embd) and a "
                             "width of at least 1")

    def hf_config(self, vocab: int):
        """The transformers config for this architecture and a ``vocab``-token tokenizer."""
        if self.family == "gpt2":
            from transformers import GPT2Config

            return GPT2Config(
                vocab_size=vocab, n_positions=self.n_positions, n_embd=self.n_embd, n_layer=self.n_layer,
                n_head=self.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                pad_token_id=0,
            )
        from transformers import MistralConfig

        return MistralConfig(
            vocab_size=vocab, hidden_size=self.n_embd, intermediate_size=self.ffn, num_hidden_layers=self.n_layer,
            num_attention_heads=self.n_head, num_key_value_heads=self.n_head, max_position_embeddings=self.n_positions,
            sliding_window=self.sliding_window, tie_word_embeddings=True, attention_dropout=0.0, rope_theta=10000.0,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )


def _lm_loss(model, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    logits = model(input_ids=batch).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    return loss, {"loss": loss.item()}


def train_lm(
    tokenizer_path: str | Path,
    corpus: Sequence[Path],
    out_dir: str | Path,
    arch: LMArch,
    cfg: OptimConfig,
    resume: bool = False,
    save_dtype: str = "float32",
    keep_checkpoint: bool = False,
    device=None,
    encoding_errors: str = "strict",
    stop_after: int | None = None,
    force: bool = False,
) -> TrainResult:
    """Train a causal LM (``arch.family``: GPT-2 or Mistral) on ``corpus`` and save it (HF format +
    ``tokenizer.json`` + ``training.json``) into ``out_dir``, loadable by ``AutoModelForCausalLM``."""
    from transformers import AutoModelForCausalLM

    from latticedraft.gpu.models.hf import resolve_dtype
    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

    cfg.validate()
    claim_dir(out_dir, TRAINED_LM, force=force, resume=resume, inputs={"--tokenizer": tokenizer_path})
    arch.check(cfg.seq_len)
    tok = load_tokenizer(tokenizer_path)
    tokens = encode_files(corpus, tok, encoding_errors)
    windows = TokenWindows(tokens, cfg.seq_len, cfg.batch_size, cfg.seed, source=f"the corpus ({len(corpus)} files)")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(arch.hf_config(vocab))
    if device is not None:
        model = model.to(device)
    arch_key = {k: v for k, v in asdict(arch).items() if k in ("n_embd", "n_layer", "n_head", "n_positions") or v not in (None, "gpt2")}
    key = {"kind": "lm", "arch": arch_key, "optim": cfg.key(),
           "tokenizer": fingerprint(tok), "tokens": int(len(tokens))}
    out = Path(out_dir)
    res = run_training(model, [{"params": [p for p in model.parameters() if p.requires_grad]}],
                       lambda b: _lm_loss(model, b), windows, cfg, out, key, resume, desc="train lm", device=device,
                       stop_after=stop_after)
    if not res.finished:
        return res

    def write(stage: Path) -> None:
        quiet_hf_progress()
        model.to(resolve_dtype(save_dtype)).save_pretrained(stage)
        model.float()
        tok.save(str(stage / "tokenizer.json"))
        write_json_atomic(stage / "training.json", {
            "kind": "lm", "arch": asdict(arch), "optim": asdict(cfg),
            "parameters": sum(p.numel() for p in model.parameters()),
            "corpus_files": len(corpus), "corpus_tokens": int(len(tokens)), "steps": res.steps, "tokens_seen": res.tokens,
            "seconds": res.seconds, "final_loss": res.losses, "resumed_from": res.resumed_from,
            "loss_every_10": [h["loss"] for h in res.history[::10]],
        })

    finish_dir(out, write, keep_checkpoint, TRAINED_LM)
    return res
