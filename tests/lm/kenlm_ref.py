"""KenLM's own scores as the reference the tests compare against."""

import math

import kenlm

LN10 = math.log(10.0)


def kenlm_logp(model: "kenlm.Model", hist, toks, begin: bool = False) -> float:
    """ln p of ``toks`` after ``hist`` by KenLM's ``BaseScore`` (log10 -> ln); the history starts
    after ``<s>`` when ``begin``, else from the null context."""
    st = kenlm.State()
    if begin:
        model.BeginSentenceWrite(st)
    else:
        model.NullContextWrite(st)
    for w in hist:
        out = kenlm.State()
        model.BaseScore(st, str(w), out)
        st = out
    total = 0.0
    for w in toks:
        out = kenlm.State()
        total += model.BaseScore(st, str(w), out)
        st = out
    return total * LN10
