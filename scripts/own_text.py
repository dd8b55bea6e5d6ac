"""A chat model's own text, for the n-gram LM its decode drafts with: questions it writes itself,
answered by it, written out as text.

The rows are self-distillation's chat rows (``gpu/train/continuations.py``, ``--distill-chat 1``):
the model continues its chat template's user-turn header into a question (sampled at T = 1, up to
``--question-tokens``, cut at its end id), then answers the question through the template, greedily
by default (what greedy decoding and its drafts meet), to ``--seq-len`` tokens in all; the answer is
not stopped at its end id, so a row may go on into a turn the model writes next. No data set is
read. Rows are made in batches by latticedraft's own decode loop (``--engine loop``) or, on a GPU,
by the model's forward over a left-padded batch (``--engine plain``: the same greedy text up to
the rounding of the batch's kernels, many times faster there), and cached under
``.cache/continuations`` (a killed run keeps its finished batches: run it again to go on). Each row
is written as its text, special tokens included, one row after another, gzip-compressed and
atomically (nothing half-written is left behind).

    .venv/bin/python scripts/own_text.py --model .cache/models/smollm2-135m-instruct \\
        --rows 2560 --seed 1 -o data/smollm2-own-answers.txt.gz

On a GPU: ``--engine plain --device cuda --batch-size 2048``.

``--prompts FILE.jsonl`` answers given prompts instead (``scripts/task_prompts.py`` writes prompts of
the kinds users ask): each row is the prompt through the template and the greedy answer, at most
``--answer-tokens``, cut after its end id; batches of similar length, each cached.

Then ``lm build --corpus ... data/smollm2-own-answers.txt.gz`` (``scripts/build_smollm2.sh``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic  # noqa: E402
from latticedraft.errors import LatticedraftError  # noqa: E402


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="the chat model's HF directory (with a chat template)")
    p.add_argument("--rows", type=int, default=2560, help="questions the model writes and answers")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row: the rendered question, then the answer")
    p.add_argument("--sample-fraction", type=float, default=0.0,
                   help="share of the answers sampled at T = 1 (the rest greedy)")
    p.add_argument("--question-tokens", type=int, default=48, help="longest question the model writes, in tokens")
    p.add_argument("--seed", type=int, default=1, help="seed of the questions and of the sampled answers")
    p.add_argument("--batch-size", type=int, default=160, help="rows the decode loop continues together")
    p.add_argument("--engine", choices=["loop", "plain"], default="loop",
                   help="loop: latticedraft's decode loop; plain: the model's forward over a padded batch (for a GPU)")
    p.add_argument("--device", default=None, help="torch device of the model (None: cpu)")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                   help="answer these prompts (records as decode --prompts reads them: a \"prompt\", chat \"messages\" or "
                        "Spec-Bench's first \"turns\"; scripts/task_prompts.py writes them) instead of questions "
                        "the model writes; each row is the rendered prompt and its greedy "
                        "answer of --answer-tokens, cut after its end id")
    p.add_argument("--answer-tokens", type=int, default=128, help="with --prompts: tokens of each answer at most")
    p.add_argument("--cache", default=None, help="continuation cache root (None: .cache/continuations)")
    p.add_argument("-o", "--out", required=True, help="the text file to write (.txt.gz)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    from latticedraft.cli.checks import check_device
    from latticedraft.decoding.runs.chat import ChatTemplate
    from latticedraft.decoding.runs.continuations import ENGINES
    from latticedraft.gpu.train.continuations import ContinuationSpec, continuations

    out, model = Path(a.out), Path(a.model)
    t0 = time.perf_counter()
    try:
        if not out.name.endswith(".txt.gz"):
            raise LatticedraftError(f"-o {out}: the text is written gzip-compressed; name it *.txt.gz")
        if out.exists() and not a.force:
            raise LatticedraftError(f"-o {out} exists; pass --force to replace it")
        if not (model / "config.json").is_file():
            raise LatticedraftError(f"--model {model} holds no config.json; pass an HF model directory "
                                    "(scripts/build_smollm2.sh makes SmolLM2's)")
        check_device(a.device)
        template = ChatTemplate.load(model, "--model")  # the questions and answers go through it: refused here, naming --model
        tokenizer = model / "tokenizer.json"
        if a.prompts is not None:
            rows, generated, seconds = answers(model, tokenizer, template, conversations(a.prompts), a)
            return write_rows(out, tokenizer, rows, {"engine": a.engine, "generated_batches": generated,
                                                     "generation_seconds": seconds,
                                                     "this_run_seconds": round(time.perf_counter() - t0, 1)})
        spec = ContinuationSpec(prompts=a.rows, seq_len=a.seq_len, sample_fraction=a.sample_fraction, seed=a.seed,
                                batch_size=a.batch_size, chat_fraction=1.0, question_tokens=a.question_tokens,
                                prompt_len=min(ContinuationSpec.prompt_len, a.seq_len - 1))  # no corpus prompts
        spec.validate({"prompts": "--rows", "batch_size": "--batch-size"})  # refused naming this script's options
        engine = ENGINES[a.engine](model, tokenizer, device=a.device)
        rows = continuations(model, np.zeros(0, dtype=np.int32), spec, tokenizer, engine, root=a.cache)
    except LatticedraftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return write_rows(out, tokenizer, list(rows.rows), {"engine": a.engine, "generated_rows": rows.generated,
                                                        "generation_seconds": rows.seconds,
                                                        "this_run_seconds": round(time.perf_counter() - t0, 1)})


def write_rows(out: Path, tokenizer: Path, rows: list, info: dict) -> int:
    """Each row's text (special tokens kept) on its own line, gzip-compressed, atomically."""
    from latticedraft.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer)
    text = "".join(tok.decode(np.asarray(r).tolist(), skip_special_tokens=False) + "\n" for r in rows)
    write_atomic(out, gzip.compress(text.encode("utf-8"), mtime=0))
    print(json.dumps({"out": str(out), "rows": len(rows), "tokens": int(sum(len(r) for r in rows)),
                      "bytes": out.stat().st_size, **info}))
    return 0


def conversations(path: str) -> list[list[dict]]:
    """Each record of a prompt file (``read_prompt_set``: refused in one line naming the file and
    line) as the messages to answer: a plain prompt as one user message."""
    from latticedraft.decoding.runs.prompt_set import read_prompt_set

    return [p.messages or [{"role": "user", "content": p.text}] for p in read_prompt_set(path)[0]]


def answers(model: Path, tokenizer: Path, template, convs: list[list[dict]], a) -> tuple[list, int, float]:
    """The model's greedy answers to ``convs`` (each a message list through its chat template):
    per prompt int64[t + n], the rendered prompt then its answer of at most ``a.answer_tokens``
    tokens, cut after the first end id. Made ``a.batch_size`` prompts at a time in order of length,
    each batch's answers cached as one .npy under the continuation cache (a killed run goes on where
    it stopped). Returns (rows in the file's order, batches made in this run, their seconds)."""
    import hashlib

    from latticedraft.atomic import atomic_file
    from latticedraft.decoding.runs.continuations import ENGINES
    from latticedraft.gpu.train.continuations import engine_setting
    from latticedraft.paths import cache_dir

    if a.answer_tokens < 1:
        raise LatticedraftError(f"--answer-tokens {a.answer_tokens} must be at least 1")
    rendered = [template.ids(c) for c in convs]
    engine = ENGINES[a.engine](model, tokenizer, device=a.device)
    weights = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in model.glob("*.safetensors"))
    key = hashlib.sha256(json.dumps({"answers": 1, "weights": weights, "tokens": a.answer_tokens,
                                     "batch": a.batch_size, **engine_setting(engine)}).encode())
    for r in rendered:
        key.update(r.tobytes() + b"|")
    where = (Path(a.cache) if a.cache else cache_dir() / "continuations") / f"answers-{key.hexdigest()[:24]}"
    where.mkdir(parents=True, exist_ok=True)
    order = sorted(range(len(rendered)), key=lambda i: len(rendered[i]))
    new, made, seconds = {}, 0, 0.0
    for s in range(0, len(order), a.batch_size):
        idx = order[s : s + a.batch_size]
        f = where / f"batch-{s:05d}.npy"
        if not f.is_file():
            t0 = time.perf_counter()
            got = np.asarray(engine([rendered[i] for i in idx], a.answer_tokens, None, a.seed, s), dtype=np.int64)
            with atomic_file(f, suffix=".npy") as tmp:
                np.save(tmp, got)
            seconds += time.perf_counter() - t0
            made += 1
            print(f"[own_text] answers {s + len(idx)}/{len(order)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        for i, row in zip(idx, np.load(f)):
            new[i] = row
    ends = set(engine.end_ids())
    rows = []
    for i, r in enumerate(rendered):
        cut = next((j + 1 for j, t in enumerate(new[i].tolist()) if t in ends), len(new[i]))
        rows.append(np.concatenate([r, new[i][:cut]]))
    return rows, made, round(seconds, 1)


if __name__ == "__main__":
    sys.exit(main())
