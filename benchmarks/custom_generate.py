"""latticedraft from transformers' ``generate``: the exported ``custom_generate`` directory against
plain ``generate`` and against latticedraft's own ``Session.decode`` on the same settings.

Rows: transformers' greedy ``generate(do_sample=False)`` (the baseline and the reference);
``generate(custom_generate=DIR)`` with no keywords (the bundled heads and the CLI's defaults) and
with ``drafter='parallel', nbest=8, slots=3`` (the fastest measured BPD drafter, benchmarks/decode.py);
``Session.decode`` with the CLI's defaults, which the custom_generate row runs (their difference
is the entry's own cost: reading generate's arguments and finding the session). The method is
loaded by transformers itself from a directory ``latticedraft export custom-generate`` writes.

Prompts one at a time (the first ``--num-prompts`` of data/prompts.jsonl, as benchmarks/decode.py);
rows round-robin ``--repeats`` times after one untimed warm-up round; seconds are medians; block
efficiency = new tokens / target calls (``return_dict_in_generate=True`` counts); "= greedy": every
output equals the baseline's token for token. The load average is recorded.

    nice -n 10 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/custom_generate.py
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from latticedraft.atomic import write_atomic
from latticedraft.paths import data_dir

GREEDY = "generate (transformers greedy)"
ROWS = {  # row -> custom_generate keywords (None: Session.decode with the CLI's defaults)
    "custom_generate (defaults)": {},
    "custom_generate drafter=parallel nbest=8 slots=3": {"drafter": "parallel", "nbest": 8, "slots": 3},
    "Session.decode (defaults)": None,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(data_dir() / "prompts.jsonl"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--out", default="benchmarks/results/custom_generate.json")
    from latticedraft.quiet import add_verbose_arg, quiet_libraries

    add_verbose_arg(ap)
    a = ap.parse_args(argv)
    quiet_libraries(a.verbose)
    from transformers import AutoModelForCausalLM

    from latticedraft.decoding import registry
    from latticedraft.decoding.custom_generate.entry import session_for
    from latticedraft.decoding.custom_generate.export import export_custom_generate
    from latticedraft.decoding.runs.loaders import encode
    from latticedraft.decoding.runs.prompt_set import read_prompts

    torch.set_num_threads(a.threads)  # (generate and the decode loop run without autograd on their own)
    model = AutoModelForCausalLM.from_pretrained(data_dir() / "base").eval()
    tmp = tempfile.mkdtemp(prefix="custom_generate.")
    atexit.register(shutil.rmtree, tmp, True)
    method = export_custom_generate(Path(tmp) / "method")
    session = session_for(model, {}, registry.get("bpd").configure({}, set()))  # configure: the CLI's defaults
    prompts = encode(session.tokenizer, [r["prompt"] for r in read_prompts(a.prompts, limit=a.num_prompts)])
    inputs = [torch.as_tensor(p)[None] for p in prompts]

    def run(row, ids):
        """(new tokens, target calls or None) of one prompt."""
        if row == GREEDY:
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=a.max_new_tokens)
            return out[0, ids.shape[1]:].tolist(), None
        kw = ROWS[row]
        if kw is None:
            r = session.decode([ids[0].numpy()], "bpd", max_new_tokens=a.max_new_tokens)  # options None: the CLI's
            return r.sequences[0].tokens.tolist(), r.sequences[0].calls
        out = model.generate(ids, custom_generate=str(method), trust_remote_code=True, max_new_tokens=a.max_new_tokens,
                             return_dict_in_generate=True, **kw)
        return out.sequences[0, ids.shape[1]:].tolist(), int(out.calls[0])

    rows = [GREEDY, *ROWS]
    for row in rows:  # warm-up: loads, measures the step cost, fits acceptance rates (cached on disk)
        run(row, inputs[0])
    seconds = {row: [] for row in rows}
    results = {}
    for _ in range(a.repeats):
        for row in rows:
            t0 = time.perf_counter()
            results[row] = [run(row, ids) for ids in inputs]
            seconds[row].append(time.perf_counter() - t0)
    ref = [toks for toks, _ in results[GREEDY]]
    table = []
    for row in rows:
        toks = sum(len(t) for t, _ in results[row])
        calls = None if row == GREEDY else sum(c for _, c in results[row])
        sec = statistics.median(seconds[row])
        table.append({"method": row, "seconds": round(sec, 4), "tokens": toks, "tokens_per_s": round(toks / sec, 1),
                      "x_greedy": round(statistics.median(seconds[GREEDY]) / sec, 2),
                      "block_efficiency": None if calls is None else round(toks / calls, 3),
                      "equal_to_greedy": [t for t, _ in results[row]] == ref})
    out = {"benchmark": "custom_generate", "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
           "repeats": a.repeats, "threads": a.threads, "load_average": os.getloadavg(),
           "cpu": platform.processor() or platform.machine(), "rows": table}
    write_atomic(Path(a.out), json.dumps(out, indent=1) + "\n")
    print(f"{len(prompts)} prompts x {a.max_new_tokens} tokens, batch 1, median of {a.repeats}, "
          f"{a.threads} thread(s), load average {out['load_average'][0]:.2f}; {a.out}")
    print("| method | tokens/s | x greedy | block eff. | = greedy |\n|---|---:|---:|---:|:---:|")
    for r in table:
        be = "-" if r["block_efficiency"] is None else f"{r['block_efficiency']:.2f}"
        print(f"| {r['method']} | {r['tokens_per_s']} | {r['x_greedy']:.2f} | {be} | "
              f"{'yes' if r['equal_to_greedy'] else 'NO'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
