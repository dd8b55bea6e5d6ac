"""Self-distillation: heads and draft models trained on what the frozen base says.

Two parts, each usable alone (``DistillConfig``):

- the text (``text="continuations"``): the base's own continuations of corpus prompts
  (``continuations.py``), instead of the corpus itself (``text="corpus"``);
- the loss (``loss="kl"``): head j at position t learns the base's own next-token distribution
  for token t+j on that text, i.e. the frozen base's softmax at position t+j-1 (teacher forcing:
  the base reads the same text), by ``KL(p_base || p_head)`` in nats/token (``Teacher``;
  ``heads.head_kl_losses``, ``lm_kl_loss``); ``loss="hard"`` keeps the cross-entropy on the
  text's own tokens (``heads.head_losses``).

Both are what Medusa-2 (self-distillation) and EAGLE train on. Alongside each KL term the loop
logs ``a{j}``: the fraction of positions where head j's argmax equals the base's (top-1 agreement).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.train.continuations import ContinuationSpec, DecoderFactory, continuations, engine_setting
from latticedraft.gpu.train.data import TokenWindows, encode_files

TEXTS = ("continuations", "corpus")
LOSSES = ("kl", "hard")


@dataclass(frozen=True)
class DistillConfig:
    """text: ``continuations`` (the base's own) or ``corpus``; loss: ``kl`` (to the base's
    distribution) or ``hard`` (cross-entropy on the text); continuation: how the continuations are
    made (its ``seq_len`` is the training ``--seq-len``); decoder: what makes them,
    ``decoder(base_dir, tokenizer_path, device)`` -> a ``continuations.BaseDecoder`` (the decode
    loop: ``latticedraft.decoding.runs.continuations.LoopDecoder``), needed by ``text="continuations"``;
    of it only its ``engine`` is part of the settings, where it is not the loop."""

    text: str = "continuations"
    loss: str = "kl"
    continuation: ContinuationSpec = field(default_factory=ContinuationSpec)
    decoder: DecoderFactory | None = field(default=None, compare=False, repr=False)

    def validate(self) -> None:
        if self.text not in TEXTS:
            raise InputError(f"--distill-text {self.text!r} is not one of {', '.join(TEXTS)}")
        if self.loss not in LOSSES:
            raise InputError(f"--distill-loss {self.loss!r} is not one of {', '.join(LOSSES)}")
        if self.text == "continuations":
            self.continuation.validate()
            if self.decoder is None:
                raise TypeError("DistillConfig(text='continuations') needs decoder=: the decode loop that continues "
                                "the prompts (latticedraft.decoding.runs.continuations.LoopDecoder)")

    def settings(self) -> dict:
        """The settings that define the training data and loss (for checkpoint keys and JSON)."""
        d = {"text": self.text, "loss": self.loss}
        if self.text == "continuations":
            d["continuation"] = self.continuation.key()
            d.update(engine_setting(self.decoder))
        return d


class Teacher:
    """The base's next-token distributions on a batch, prepared once for every head's KL term.

    ``logits`` [b, s, V] → ``p`` [b, s, V] (probabilities), ``entropy`` [b, s] (nats) and
    ``argmax`` [b, s]. ``kl(student_logits, lo, hi)`` is the mean over positions ``lo..hi-1`` of
    ``KL(p || softmax(student_logits))`` with ``student_logits`` [b, hi - lo, V]: the soft-target
    cross-entropy (one fused ``cross_entropy`` call, whose gradient is ``softmax(student) - p``)
    minus the teacher's entropy there."""

    def __init__(self, logits: torch.Tensor):
        logp = torch.log_softmax(logits.detach().float(), dim=-1)
        self.p = logp.exp()
        self.entropy = -(self.p * logp).sum(-1)
        self.argmax = logp.argmax(-1)

    def kl(self, student_logits: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        V = student_logits.shape[-1]
        ce = torch.nn.functional.cross_entropy(student_logits.float().reshape(-1, V), self.p[:, lo:hi].reshape(-1, V))
        return ce - self.entropy[:, lo:hi].mean()

    def agreement(self, student_logits: torch.Tensor, lo: int, hi: int) -> float:
        """Fraction of positions ``lo..hi-1`` where the student's argmax is the teacher's."""
        return (student_logits.argmax(-1) == self.argmax[:, lo:hi]).float().mean().item()


def lm_kl_loss(student, batch: torch.Tensor, teacher) -> tuple[torch.Tensor, float]:
    """A draft model's ``KL(p_base || p_student)`` of the next token at every position of ``batch``
    (int64[b, s]), with the frozen ``teacher`` reading the same text; and its top-1 agreement."""
    s = batch.shape[1]
    with torch.no_grad():
        t = Teacher(teacher(input_ids=batch).logits)
    logits = student(input_ids=batch).logits
    return t.kl(logits, 0, s), t.agreement(logits, 0, s)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen, eval-mode copy of ``model`` (the teacher when the model itself trains)."""
    import copy

    t = copy.deepcopy(model).eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t


@dataclass
class TrainingText:
    """The windows a distillation run trains on, and what the JSON says about them."""

    windows: TokenWindows
    info: dict


def training_text(base_dir: Path, corpus, tok, tokenizer_path: Path, seq_len: int, batch_size: int, seed: int,
                  distill: DistillConfig | None, encoding_errors: str = "strict", device=None) -> TrainingText:
    """Corpus windows (``distill`` None or ``text="corpus"``) or the base's continuations, one
    window per row (``text="continuations"``; the rows are ``seq_len`` tokens long)."""
    made = distill is not None and distill.text == "continuations"
    decoder = distill.decoder(base_dir, tokenizer_path, device) if made else None
    if made and distill.continuation.chat_rows:
        decoder.chat()  # refused before the corpus is read
    stream = encode_files(corpus, tok, encoding_errors)
    info: dict = {"corpus_files": len(corpus), "corpus_tokens": int(len(stream))}
    if not made:
        return TrainingText(TokenWindows(stream, seq_len, batch_size, seed, source=f"the corpus ({len(corpus)} files)"),
                            info)
    spec = replace(distill.continuation, seq_len=seq_len)
    c = continuations(base_dir, stream, spec, tokenizer_path, decoder)
    info.update({"continuation_rows": int(len(c.rows)), "continuation_greedy_rows": c.greedy_rows,
                 "continuation_tokens": int(c.rows.size), "continuation_seconds": c.seconds,
                 "continuation_cache": c.where})
    rows = np.ascontiguousarray(c.rows).reshape(-1)
    return TrainingText(TokenWindows(rows, seq_len, batch_size, seed, source=f"{len(c.rows)} base continuations"), info)
