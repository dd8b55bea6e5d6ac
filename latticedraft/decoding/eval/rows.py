"""The rows that ``latticedraft demo`` and ``benchmarks/spec_bench.py`` compare, defined once.

Each is a lossless greedy decoder a user could run, by what it drafts from:

- ``SELF_DRAFT``: the model's own weights at 4 bits drafting a chain, nothing else
  (``decode --drafter none --self-draft int4 --context-ngrams 0 --lm-drafts 0``);
- ``HEADS_ONLY`` / ``RESCORED_HEADS``: the 8 best paths of the heads' lattice over 3 slots, as the
  heads score them / rescored by the n-gram LM (BPD) at the weight it learns while decoding, as
  ``decode --drafter parallel`` does, no other source;
- ``NGRAMS``: context n-grams and the n-gram LM's continuation on latticedraft's verifier, no
  drafter, no self-draft;
- ``int4_copy(session)``: the same 4-bit copy as an HF module, HF assisted generation's
  ``assistant_model`` (built once per session).

The CLI's default (whatever ``latticedraft decode --model M`` runs) is read from the CLI's own
parser (``latticedraft.cli.decode_options``) by the callers, never restated here.

Spec-Bench's six categories (``CATEGORIES``; MT-bench's eight kinds, ``MT_BENCH``, count as one)
also name the kinds of the chat questions shipped in ``data/chat-questions.jsonl``.
"""

from __future__ import annotations

from dataclasses import replace

from latticedraft.decoding.methods.bpd import DrafterSpec

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")  # Spec-Bench's six

SELF_DRAFT = DrafterSpec("none", tree="auto", self_draft="int4")
HEADS_ONLY = DrafterSpec("parallel-base", nbest=8, slots=3, tree="auto", draft_vocab="auto")
RESCORED_HEADS = replace(HEADS_ONLY, name="parallel", alpha=None)  # (alpha learned, as `decode --drafter parallel`)
NGRAMS = replace(DrafterSpec("none").fast(), self_draft="off")


def bench_category(category: str | None) -> str | None:
    """Spec-Bench's category of a question kind: an MT-bench kind is ``mt_bench``."""
    return "mt_bench" if category in MT_BENCH else category


def int4_copy(session):
    """The session's model's own int4 copy as an HF causal LM (``quantized_copy``), built once."""
    from latticedraft.gpu.models.quantized import Scheme, quantized_copy

    base = getattr(session.model, "base", session.model)
    return session.once(("int4 copy",), lambda: quantized_copy(base, Scheme("int4")))
