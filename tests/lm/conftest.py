"""Shared fixtures: a small synthetic corpus and one tiny LM build reused by the lm tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
_WORDS = ("alpha beta gamma delta value result index count item name data self other "
          "return if else for while in not and or None True False print len range").split()


def synthetic_text(n_paragraphs: int, seed: int) -> str:
    """Python-like text the project has never seen: random statements in paragraphs."""
    rng = random.Random(seed)
    paras = []
    for _ in range(n_paragraphs):
        lines = [f"def {rng.choice(_WORDS)}_{rng.randint(0, 30)}({rng.choice(_WORDS)}, {rng.choice(_WORDS)}):"]
        for _ in range(rng.randint(1, 6)):
            a, b, c = rng.choice(_WORDS), rng.choice(_WORDS), rng.choice(_WORDS)
            lines.append(rng.choice([f"    {a} = {b}({c}) + {rng.randint(0, 99)}", f"    if {a} {b} {c}:",
                                     f"    return {a}.{b}", f"    for {a} in {b}:", f"        {a}[{c}] += 1"]))
        paras.append("\n".join(lines) + "\n")
    return "\n".join(paras)


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("corpus") / "train.txt"
    p.write_text(synthetic_text(600, seed=1))
    return p


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory, corpus_file) -> Path:
    """A 3-gram built with a trained 300-token BPE (pruned trigrams) — the library path."""
    from latticedraft.lm.build import BuildOptions, build

    out = tmp_path_factory.mktemp("builds") / "tri"
    build(BuildOptions(corpus=[str(corpus_file)], out=out, order=3, prune=[0, 0, 1], train_tokenizer=300,
                       memory="64M", progress=False))
    return out


@pytest.fixture
def tiny_arpa() -> Path:
    return FIXTURES / "tiny.arpa"
