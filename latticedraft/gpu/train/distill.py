"""Self-distillation: heads and draft models trained on what the frozen base says.

Two parts, each usable alone (``DistillConfig``):

- the text (``text="continuations"``): the base's own continuations of corpus prompts
  (``continuations.py``), instead of the corpus itself (``text="corpus"``);
- the loss (``loss="kl"``): head j at position t learns the base's own next-token distribution
  for token t+j on that text, i.e. the frozen base's softmax at position t+j-1 (teacher forcing:
  the base reads the same text), by ``KL(p_base || p_head)`` in nats/token; ``loss="hard"`` keeps
  the cross-entropy on the text's own tokens (``heads.head_losses``).

Both are what Medusa-2 (self-distillation) and EAGLE train on. Alongside each KL term the loop
logs ``a{j}``: the fraction of positions where head j's argmax equals the base's (top-1 agreement).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from latticedraft.errors import InputError
from latticedraft.gpu.train.continuations import ContinuationSpec, chat_template, continuations
from latticedraft.gpu.train.data import TokenWindows, encode_files

TEXTS = ("continuations", "corpus")
LOSSES = ("kl", "hard")


@dataclass(frozen=True)
class DistillConfig:
    """text: ``continuations`` (the base's own) or ``corpus``; loss: ``kl`` (to the base's
    distribution) or ``hard`` (cross-entropy on the text); continuation: how the continuations are
    made (its ``seq_len`` is the training ``--seq-len``)."""

    text: str = "continuations"
    loss: str = "kl"
    continuation: ContinuationSpec = field(default_factory=ContinuationSpec)

    def validate(self) -> None:
        if self.text not in TEXTS:
            raise InputError(f"--distill-text {self.text!r} is not one of {', '.join(TEXTS)}")
        if self.loss not in LOSSES:
            raise InputError(f"--distill-loss {self.loss!r} is not one of {', '.join(LOSSES)}")
        if self.text == "continuations":
            self.continuation.validate()

    def settings(self) -> dict:
        """The settings that define the training data and loss (for checkpoint keys and JSON)."""
        d = {"text": self.text, "loss": self.loss}
        if self.text == "continuations":
            d["continuation"] = self.continuation.key()
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


def head_kl_losses(bm, batch: torch.Tensor, teacher_logits: torch.Tensor | None = None, frozen: bool = True,
                   stem_grad_scale: float = 1.0) -> tuple[list[torch.Tensor], list[float]]:
    """Per head j = 1..h (list index j-1): ``KL(p_base(. | x_{<=t+j-1}) || p_head_j(. | x_{<=t}))`` over
    positions t < s - j + 1 of ``batch`` (int64[b, s]), and head j's top-1 agreement with the base there.

    ``teacher_logits`` [b, s, V]: the frozen base's logits on ``batch`` (None: the base's own
    logits of this forward, which is the teacher when the base is frozen). Head 1 is the base:
    its KL is 0 when frozen (a constant, no gradient), else the drift of the training base from
    the teacher. Gradients reach the trunk as in ``heads.head_losses``."""
    from latticedraft.gpu.train.heads import head_logits, head_states

    s = batch.shape[1]
    if teacher_logits is None and not frozen:
        raise InputError("an unfrozen base needs a separate frozen teacher for the KL loss")
    out, states, scale = head_states(bm, batch, frozen, stem_grad_scale)
    teacher = Teacher(out.logits if teacher_logits is None else teacher_logits)
    if frozen:
        losses, agree = [out.logits.new_zeros(())], [1.0]
    else:
        losses, agree = [teacher.kl(out.logits, 0, s)], [teacher.agreement(out.logits, 0, s)]
    for j in range(2, bm.num_heads + 1):
        logits = head_logits(bm, states, j, s - j, scale)
        losses.append(teacher.kl(logits, j - 1, s - 1))
        agree.append(teacher.agreement(logits, j - 1, s - 1))
    return losses, agree


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
    chat = distill is not None and distill.text == "continuations" and distill.continuation.chat_fraction > 0
    template = chat_template(base_dir) if chat else None  # refused before the corpus is read
    stream = encode_files(corpus, tok, encoding_errors)
    info: dict = {"corpus_files": len(corpus), "corpus_tokens": int(len(stream))}
    if distill is None or distill.text == "corpus":
        return TrainingText(TokenWindows(stream, seq_len, batch_size, seed, source=f"the corpus ({len(corpus)} files)"),
                            info)
    spec = replace(distill.continuation, seq_len=seq_len)
    c = continuations(base_dir, stream, spec, tokenizer_path, device=device, template=template)
    info.update({"continuation_rows": int(len(c.rows)), "continuation_greedy_rows": c.greedy_rows,
                 "continuation_tokens": int(c.rows.size), "continuation_seconds": c.seconds,
                 "continuation_cache": c.where})
    rows = np.ascontiguousarray(c.rows).reshape(-1)
    return TrainingText(TokenWindows(rows, seq_len, batch_size, seed, source=f"{len(c.rows)} base continuations"), info)
