"""``latticedraft demo``: the bundled model against greedy and prompt lookup, speed and exactness."""

from __future__ import annotations

import sys
from pathlib import Path

from latticedraft.cli.args import common_model_args


def _cmd_demo(a) -> int:
    from latticedraft.cli.checks import check_device, check_ranges
    from latticedraft.decoding.eval.demo import run_demo, table
    from latticedraft.decoding.eval.tune import default_alphas_file, read_alphas
    from latticedraft.decoding.runs.session import Session
    from latticedraft.paths import check_writable

    check_device(a.device)
    check_ranges(a)
    check_writable(a.out, "--out", "directory")
    print(f"latticedraft demo: the bundled BPD model on {a.num_prompts} held-out standard-library prompts, "
          f"{a.max_new_tokens} new tokens each", file=sys.stderr)
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads)
    s.notify = lambda m: print(m, file=sys.stderr)
    alphas_file = a.alphas or default_alphas_file(s.model_dir)
    if alphas_file:
        print(f"interpolation weights from {alphas_file}", file=sys.stderr)
    else:
        print("untuned interpolation weight alpha = 1.0 (write tuned ones with `latticedraft tune --out "
              "data/heads-stern/tuned.json`)", file=sys.stderr)
    summary = run_demo(s, a.prompts, a.num_prompts, a.max_new_tokens, a.out,
                       notify=lambda m: print(m, file=sys.stderr),
                       alphas=read_alphas(alphas_file) if alphas_file else None)
    smp = summary["sample"]
    cont = smp["continuation"]
    shown = cont.replace("\n", "\u23ce")[:160] + ("…" if len(cont) > 160 else "")
    print("\nexample: the end of a held-out prompt, then the model's greedy continuation (\u23ce = newline):")
    print("  " + smp["prompt"].rstrip("\n").splitlines()[-1][-100:] + "\n  >>> " + shown)
    print()
    print(table(summary))
    print()
    ok = summary["all_exact"]
    print(("every output equals plain greedy decoding, token for token: yes" if ok
           else "MISMATCH: some output differs from greedy decoding"))
    if summary["lattice_png"]:
        print(f"one step's lattice: {summary['lattice_png']}")
    print(f"details: {Path(a.out) / 'demo.json'}")
    return 0 if ok else 1


def add_parser(groups) -> None:
    p = groups.add_parser("demo", help="the bundled model: BPD drafters vs greedy, speed and exactness",
                          description="Run the bundled BPD model on held-out standard-library prompts with each "
                                      "drafter and plain greedy decoding; print speed, block efficiency and whether "
                                      "every output equals greedy decoding.")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="prompt set (default data/prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, default=6, help="prompts (default 6)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per prompt (default 48)")
    p.add_argument("--lm", default=None, metavar="DIR", help="n-gram LM build (default: the bundled 4-gram)")
    p.add_argument("--rescorer", default=None, metavar="DIR", help="neural rescorer (default data/rescorer-small)")
    p.add_argument("--alphas", default=None, metavar="tuned.json", help="alphas from `latticedraft tune` (default 1.0)")
    p.add_argument("-o", "--out", type=Path, default=Path("out/demo"),
                   help="output directory for demo.json and the lattice picture (default ./out/demo)")
    common_model_args(p)
    p.set_defaults(threads=1)
    p.set_defaults(func=_cmd_demo)
