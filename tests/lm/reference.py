"""A slow, obviously-correct reading of ARPA back-off semantics (the tests' oracle).

p(w | h) = p(h w) if the n-gram ``h w`` is listed, else bo(h) + p(w | h[1:]) (log10; bo of an
unlisted context is 0); the context is the last n-1 words, ``<s>`` first at sentence start.
"""

from __future__ import annotations

import math


def read_arpa_dict(path) -> tuple[int, dict[tuple[str, ...], tuple[float, float]]]:
    grams: dict[tuple[str, ...], tuple[float, float]] = {}
    order = 0
    section = 0
    for line in open(path, encoding="utf-8"):
        s = line.strip()
        if not s or s == "\\data\\" or s == "\\end\\":
            continue
        if s.startswith("ngram "):
            order = max(order, int(s[6:].split("=")[0]))
            continue
        if s.startswith("\\") and s.endswith("-grams:"):
            section = int(s[1:].split("-")[0])
            continue
        f = s.split()
        words = tuple(f[1 : 1 + section])
        bo = float(f[1 + section]) if len(f) > 1 + section else 0.0
        grams[words] = (float(f[0]), bo)
    return order, grams


def log10_prob(order: int, grams: dict, history: list[str], word: str) -> float:
    ctx = tuple(history[-(order - 1):]) if order > 1 else ()
    if word not in {w[0] for w in grams if len(w) == 1}:
        word = "<unk>"
    total = 0.0
    while True:
        if ctx + (word,) in grams:
            return total + grams[ctx + (word,)][0]
        if not ctx:
            return total + grams.get((word,), (-math.inf, 0))[0]
        total += grams.get(ctx, (0.0, 0.0))[1]
        ctx = ctx[1:]


def sentence_log10(order: int, grams: dict, words: list[str]) -> list[float]:
    """log10 p of each word after ``<s>`` (no ``</s>``)."""
    hist = ["<s>"]
    out = []
    for w in words:
        out.append(log10_prob(order, grams, hist, w))
        hist.append(w)
    return out
