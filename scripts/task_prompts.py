"""Chat prompts of the kinds users ask (Spec-Bench's task kinds), made from text on this machine.

SmolLM2's drafters learned from its answers to questions it wrote itself, short and simple, while
users ask it to translate, summarise, answer from passages, solve word problems and write code.
This writes prompts of those kinds, one JSON object per line (``{"prompt": ..., "kind": ...}``),
for ``scripts/own_text.py --prompts`` to have the model answer. No data set is read and no
benchmark question is used; the sources are what a Debian Python machine holds:

    translate  "Translate German to English: S", S a German sentence of a message catalogue under
               /usr/share/locale/de (gettext .mo files)
    summarize  "Summarize: P", P 600-1600 characters of the Python language reference's prose
               (``pydoc_data.topics``)
    rag        two such passages, then a question about the first one's topic
    math       a grade-school word problem from a template, with drawn names and numbers
    code       "Write a Python function ...", from the first sentence of a standard-library
               function's docstring

    .venv/bin/python scripts/task_prompts.py --count 1536 --seed 0 -o .cache/task-prompts.jsonl
"""

from __future__ import annotations

import argparse
import gettext
import glob
import inspect
import json
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402

SHARES = {"translate": 0.3, "summarize": 0.2, "rag": 0.2, "math": 0.2, "code": 0.1}
NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kara", "Liam",
         "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara"]
ITEMS = [("apples", "bag"), ("pencils", "box"), ("cookies", "tray"), ("stickers", "sheet"), ("eggs", "carton"),
         ("marbles", "jar"), ("books", "shelf"), ("cupcakes", "plate")]
MATH = [  # names n, m, an item in its box and the numbers a..d are drawn per problem
    "{n} buys {a} {box}es of {item}. Each {box} holds {b} {item}. {n} gives away {c} {item}. How many {item} "
    "does {n} have left?",
    "{n} earns ${a} an hour and works {b} hours a week. After {c} weeks, {n} spends ${d} on a bike. How much "
    "money does {n} have now?",
    "A train travels {a} miles in {b} hours. At the same speed, how far does it travel in {c} hours?",
    "{n} has {a} {item}. {m} has {b} more {item} than {n}. How many {item} do they have together?",
    "A shop sells a {box} of {item} for ${b}. {n} buys {a} {box}es and pays with ${d}. How much change does "
    "{n} get?",
    "{n} reads {a} pages on Monday and twice as many on Tuesday. The book has {d} pages. How many pages are "
    "left to read?",
    "There are {a} students in a class. {c} percent of them walk to school and the rest take the bus. How many "
    "students take the bus?",
    "{n} saves ${b} every week. How many weeks does it take {n} to save ${d}?",
    "A rectangle is {a} meters long and {b} meters wide. What is its area and what is its perimeter?",
    "{n} bakes {a} {item} and sells them for ${b} each. The ingredients cost ${c}. What is {n}'s profit?",
]
RAG_QUESTIONS = ["What do the passages say about {t}?", "Explain {t} using the text above.",
                 "How does {t} work, according to the passages?", "Summarize what the first passage says about {t}."]
CODE_STARTS = ["Write a Python function that", "Implement a Python function that", "Write Python code that"]


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--count", type=int, default=1536, help="prompts to write, shared among the kinds as SHARES says")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws")
    p.add_argument("--locale-dir", default="/usr/share/locale/de/LC_MESSAGES", help="German gettext catalogues")
    p.add_argument("-o", "--out", required=True, help="the JSON-lines file to write")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    return p.parse_args(argv)


def german_sentences(locale_dir: str) -> list[str]:
    """Whole German sentences of 7+ words from the .mo catalogues, without format fields or markup."""
    out = set()
    for f in sorted(glob.glob(str(Path(locale_dir) / "*.mo"))):
        try:
            with open(f, "rb") as fh:
                catalog = gettext.GNUTranslations(fh)._catalog
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            continue  # a catalogue this gettext cannot read
        for k, v in catalog.items():
            v = v.strip() if isinstance(v, str) else ""
            if isinstance(k, str) and k and len(v.split()) >= 7 and v[-1] in ".!?" and not re.search(r"[%{}<>\n\\]", v):
                out.add(v)
    return sorted(out)


def reference_passages() -> list[tuple[str, str]]:
    """(topic, passage): the language reference's prose, cut at paragraphs into 600-1600 characters."""
    from pydoc_data.topics import topics

    out = []
    for name in sorted(topics):
        paras = [re.sub(r"\s+", " ", p).strip() for p in topics[name].split("\n\n")]
        paras = [p for p in paras if len(p) > 80 and not p.startswith((">>>", "...")) and p.count("*") < 4]
        cur = ""
        for p in paras:
            cur = f"{cur} {p}".strip()
            if len(cur) >= 600:
                out.append((name, cur[:1600]))
                cur = ""
    return out


def function_tasks() -> list[str]:
    """The first sentence of public standard-library functions' docstrings, as a task."""
    import importlib

    out = set()
    for mod in ["string", "textwrap", "statistics", "itertools", "functools", "os.path", "shutil", "json",
                "collections", "heapq", "bisect", "math", "random", "re", "csv", "datetime", "fnmatch", "glob",
                "difflib", "html", "urllib.parse", "base64", "hashlib", "zipfile", "calendar", "operator"]:
        m = importlib.import_module(mod)
        for name, fn in inspect.getmembers(m, callable):
            doc = inspect.getdoc(fn) or ""
            first = re.split(r"(?<=\.)\s", doc.replace("\n", " "), maxsplit=1)[0].strip()
            if name.startswith("_") or not (25 <= len(first) <= 160) or not first.endswith("."):
                continue
            if re.match(r"(Return|Returns|Compute|Convert|Split|Find|Make|Test|Remove|Create|Encode|Decode|Parse|"
                        r"Check|Count|Calculate|Get|Join|Replace)\b", first):
                out.add(first[0].lower() + first[1:])
    return sorted(out)


def math_problem(rng: random.Random) -> str:
    n, m = rng.sample(NAMES, 2)
    item, box = rng.choice(ITEMS)
    a, b = rng.randint(3, 24), rng.randint(2, 15)
    c, d = rng.choice([10, 20, 25, 40, 50, 60, 75]) if rng.random() < 0.3 else rng.randint(2, 12), rng.randint(50, 400)
    return rng.choice(MATH).format(n=n, m=m, item=item, box=box, a=a, b=b, c=c, d=d)


def drawer(pool: list, rng: random.Random):
    """Draws from ``pool`` without replacement, reshuffling it when it runs out."""
    while True:
        order = list(pool)
        rng.shuffle(order)
        yield from order


def prompts(count: int, seed: int, locale_dir: str) -> list[dict]:
    """``count`` prompts, the kinds interleaved in a seeded order."""
    rng = random.Random(seed)
    german, passages, tasks = german_sentences(locale_dir), reference_passages(), function_tasks()
    if not german:
        raise ValueError(f"no German sentences under --locale-dir {locale_dir}; point it at a directory of "
                         "German gettext catalogues (*.mo, e.g. /usr/share/locale/de/LC_MESSAGES)")
    de, summ, rag, code = (drawer(p, rng) for p in (german, passages, passages, tasks))
    out = []
    for kind, share in SHARES.items():
        for _ in range(round(count * share)):
            if kind == "translate":
                text = f"Translate German to English: {next(de)}"
            elif kind == "summarize":
                text = f"Summarize: {next(summ)[1]}"
            elif kind == "rag":
                (topic, first), (_, second) = next(rag), next(rag)
                t = topic.replace("-", " ")
                text = f"{first}\n{second}\n{rng.choice(RAG_QUESTIONS).format(t=t)}"
            elif kind == "math":
                text = math_problem(rng)
            else:
                text = f"{rng.choice(CODE_STARTS)} does this: {next(code)}"
            out.append({"prompt": text, "kind": kind})
    rng.shuffle(out)
    return out[:count]


def main(argv=None) -> int:
    a = parse(argv)
    out = Path(a.out)
    if out.exists() and not a.force:
        print(f"error: -o {out} exists; pass --force to replace it", file=sys.stderr)
        return 2
    if a.count < len(SHARES):
        print(f"error: --count {a.count}: give at least {len(SHARES)} (the kinds share them)", file=sys.stderr)
        return 2
    try:
        rows = prompts(a.count, a.seed, a.locale_dir)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_atomic(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    kinds = {k: sum(r["kind"] == k for r in rows) for k in SHARES}
    print(json.dumps({"out": str(out), "prompts": len(rows), "kinds": kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
