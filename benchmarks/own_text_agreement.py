"""Is text that ``scripts/own_text.py`` wrote elsewhere (e.g. ``--engine plain`` on a GPU) the
model's own greedy text here? Rows are cut where the chat template's text before a user message
starts (its system turn and the user header, for SmolLM2); for rows drawn at random, the question
(up to the text that opens the assistant's turn) is rendered through the template again, our
decode loop answers it greedily on this machine (float32, batch 1: what ``decode`` and HF greedy
write), and the answer's text is compared with the row's: the row agrees up to the first answer
token whose text departs. (A row the model continued into a conversation of its own with the same
header is cut there too; such a piece has no answer and is skipped.)

    .venv/bin/python benchmarks/own_text_agreement.py --model .cache/models/smollm2-135m-instruct \\
        --text data/smollm2-own-answers-gpu.txt.xz --rows 12 --tokens 64 --out agreement.json

Writes JSON (per row: file, prompt tokens, agreeing tokens) and prints a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def questions_and_answers(path: Path, before: str, after: str) -> list[tuple[str, str]]:
    """(question, answer text) of each row of one own-text file: a row starts with ``before`` and
    its question ends at ``after`` (rows may hold newlines, so they are cut at ``before``)."""
    from latticedraft.lm.corpus import read_text

    text = read_text(path)
    out = []
    for piece in text.split(before)[1:]:
        if after in piece:
            q, _, answer = piece.partition(after)
            out.append((q, answer.rstrip("\n")))
    return out


def agreeing_tokens(ids: list[int], row_answer: str, decode) -> int:
    """How many of ``ids`` (our answer) agree with ``row_answer``: the longest prefix whose text
    the row's answer starts with."""
    lo = 0
    for k in range(1, len(ids) + 1):
        if not row_answer.startswith(decode(ids[:k])):
            break
        lo = k
    return lo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the chat model's HF directory")
    p.add_argument("--text", nargs="+", required=True, help="own_text.py outputs (*.txt.gz; .xz too)")
    p.add_argument("--rows", type=int, default=12, help="rows drawn at random")
    p.add_argument("--tokens", type=int, default=64, help="answer tokens compared per row")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file to write")
    a = p.parse_args(argv)
    from latticedraft.decoding.runs.chat import ChatTemplate
    from latticedraft.decoding.runs.continuations import LoopDecoder
    from latticedraft.lm.tokenizer import load_tokenizer

    tok = load_tokenizer(Path(a.model) / "tokenizer.json")
    template = ChatTemplate.load(a.model, "--model")
    before, after = template.around_user_text()
    rows = [(f, qa) for f in a.text for qa in questions_and_answers(Path(f), before, after)]
    pick = random.Random(a.seed).sample(rows, min(a.rows, len(rows)))
    ours = LoopDecoder(a.model)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    out, t0 = [], time.perf_counter()
    for f, (question, answer) in pick:
        prompt = template.ids([{"role": "user", "content": question}])
        ids = ours([prompt], a.tokens, None, 0, 0)[0].tolist()
        n = agreeing_tokens(ids, answer, decode)
        whole = len(decode(ids)) <= len(answer)  # the row holds all of our answer's text (else it was cut)
        out.append({"file": Path(f).name, "prompt_tokens": int(len(prompt)), "agreeing_tokens": n,
                    "compared_tokens": a.tokens, "row_holds_the_whole_answer": whole})
        print(f"{Path(f).name}: prompt {len(prompt)} tokens, {n}/{a.tokens} answer tokens agree", file=sys.stderr)
    full = sum(r["agreeing_tokens"] == a.tokens for r in out)
    summary = {"rows": len(out), "rows_agreeing_fully": full,
               "tokens_agreeing": sum(r["agreeing_tokens"] for r in out), "tokens_compared": a.tokens * len(out),
               "seconds": round(time.perf_counter() - t0, 1), "model": a.model, "text": a.text, "per_row": out}
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{full} of {len(out)} rows agree for all {a.tokens} answer tokens; "
          f"{summary['tokens_agreeing']} of {summary['tokens_compared']} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
