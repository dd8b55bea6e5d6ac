"""``latticedraft demo``: the bundled model against greedy and prompt lookup, speed and exactness."""

from __future__ import annotations

import sys
from pathlib import Path

from latticedraft.cli.args import common_model_args


def _cmd_demo(a) -> int:
    """The demo's table on the bundled model, or (``--model smollm2``) on SmolLM2 with chat questions."""
    from latticedraft.cli.checks import check_device, check_ranges, given
    from latticedraft.decoding.eval.demo import run_demo, table
    from latticedraft.decoding.eval.tune import default_alphas_file, read_alphas
    from latticedraft.decoding.runs.loaders import check_model_dir
    from latticedraft.decoding.runs.prompt_set import read_prompt_set
    from latticedraft.decoding.runs.session import Session
    from latticedraft.paths import data_dir

    check_device(a.device)
    check_ranges(a)  # --out was claimed before the command started (output_options)
    chat = a.model == "smollm2"
    if chat:  # the real pretrained model on chat questions through its chat template
        from latticedraft.errors import InputError
        from latticedraft.paths import smollm2_dir

        if not smollm2_dir().is_dir():
            raise InputError(f"--model smollm2: {smollm2_dir()} does not exist; run `latticedraft fetch smollm2` (or "
                             "`bash scripts/build_smollm2.sh`, which also builds its 4-gram) first")
        a.model, why_no_heads = smollm2_model()
        if why_no_heads:
            print(f"SmolLM2 without heads: {why_no_heads}", file=sys.stderr)
        a.prompts = a.prompts or str(data_dir() / "chat-prompts.jsonl")
        if not given(a, "threads"):  # the weights set its step (not per-op overhead): every core
            a.threads = None
        banner = f"SmolLM2-135M-Instruct on {a.num_prompts} chat questions through its chat template"
    else:
        check_model_dir(a.model)
        banner = (f"{'the bundled BPD model' if a.model is None else a.model} on {a.num_prompts} "
                  f"{'held-out standard-library ' if a.prompts is None else ''}prompts")
    read_prompt_set(a.prompts or data_dir() / "prompts.jsonl", limit=a.num_prompts)  # bad lines: before the load
    print(f"latticedraft demo: {banner}, {a.max_new_tokens} new tokens each", file=sys.stderr)  # once all is checked
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads)
    s.notify = lambda m: print(m, file=sys.stderr)
    alphas_file = a.alphas or default_alphas_file(s.model_dir)
    heads = getattr(s.model, "num_heads", 1) > 1  # without heads no row rescores a lattice: no weight to report
    if heads and alphas_file:
        print(f"interpolation weights from {alphas_file}", file=sys.stderr)
    elif heads:
        print("untuned interpolation weight alpha = 1.0 (write tuned ones with `latticedraft tune --out "
              f"{Path(s.model_dir) / 'tuned.json'}`)", file=sys.stderr)
    summary = run_demo(s, a.prompts, a.num_prompts, a.max_new_tokens, a.out,
                       notify=lambda m: print(m, file=sys.stderr),
                       alphas=read_alphas(alphas_file) if alphas_file else None, chat=chat)
    smp = summary["sample"]
    cont = smp["continuation"]
    shown = cont.replace("\n", "\u23ce")[:160] + ("…" if len(cont) > 160 else "")
    print(f"\nexample: the end of a {'question' if chat else 'held-out prompt'}, then the model's greedy "
          "continuation (\u23ce = newline):")
    print("  " + smp["prompt"].rstrip("\n").splitlines()[-1][-100:] + "\n  >>> " + shown)
    print()
    print(table(summary))
    print()
    ok = summary["all_exact"]
    print(("every output equals plain greedy decoding, token for token: yes" if ok
           else "MISMATCH: some output differs from greedy decoding"))
    if summary["lattice_png"]:
        print(f"one step's lattice: {summary['lattice_png']}")
    else:
        print("no lattice picture: the model has no heads")
    print(f"details: {Path(a.out) / 'demo.json'}")
    return 0 if ok else 1


def smollm2_model() -> tuple[str, str | None]:
    """What ``--model smollm2`` decodes with: the heads built for it (``data/heads-smollm2``) where their
    base is the fetched model (``paths.smollm2_dir()``), else that model alone and why (one line)."""
    import json

    from latticedraft.paths import data_dir, smollm2_dir

    base, heads = smollm2_dir(), data_dir() / "heads-smollm2"
    try:
        made_for = (heads / json.loads((heads / "heads_config.json").read_text())["base"]).resolve()
    except (OSError, ValueError, KeyError, TypeError):
        return str(base), (f"{heads} holds no heads (`bash scripts/build_smollm2.sh --heads` trains them, about an "
                           "hour on a 2-core CPU)")
    if made_for != base.resolve():
        return str(base), (f"the heads in {heads} sit on {made_for}, not on {base} (decode with "
                           f"`--model {heads}` where that model is)")
    return str(heads), None


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_dir
    from latticedraft.outputs import DEMO

    p = groups.add_parser("demo", help="the bundled model: BPD drafters vs greedy, speed and exactness",
                          description="Run the bundled BPD model on held-out standard-library prompts with each "
                                      "drafter and plain greedy decoding; print speed, block efficiency and whether "
                                      "every output equals greedy decoding. --model smollm2 runs the real "
                                      "pretrained SmolLM2-135M-Instruct (`latticedraft fetch smollm2`) with its heads "
                                      "(data/heads-smollm2) on chat questions through its chat template.")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                   help="prompt set (default data/prompts.jsonl; with --model smollm2 data/chat-prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, default=6, help="prompts (default 6)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per prompt (default 48)")
    p.add_argument("--lm", default=None, metavar="DIR", help="n-gram LM build (default: the bundled 4-gram)")
    p.add_argument("--rescorer", default=None, metavar="DIR", help="neural rescorer (default data/rescorer-small)")
    p.add_argument("--alphas", default=None, metavar="tuned.json", help="alphas from `latticedraft tune` (default 1.0)")
    common_model_args(p)
    out_dir(p, DEMO, inputs=("prompts", "model", "tokenizer", "lm", "rescorer", "alphas"), default=Path("out/demo"),
            help="output directory for demo.json and the lattice picture (default ./out/demo)")
    p.add_argument("--force", action="store_true", help="replace the demo.json and picture an earlier demo wrote in --out")
    p.set_defaults(threads=1)
    p.set_defaults(func=_cmd_demo)
