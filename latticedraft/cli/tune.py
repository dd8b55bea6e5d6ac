"""``latticedraft tune``: alpha per drafter family, or lookahead's (W, N, G), on a held-out split."""

from __future__ import annotations

import sys
from pathlib import Path

from latticedraft.cli.args import common_model_args
from latticedraft.outputs import FileKind


def _is_tune_result(path) -> bool:
    """Whether file ``path`` is a JSON object ``tune`` wrote: ``alphas`` + ``sweep`` (--method bpd) or
    ``lookahead`` + ``table`` (--method lookahead)."""
    import json

    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(obj, dict) and ({"alphas", "sweep"} <= set(obj) or {"lookahead", "table"} <= set(obj))


TUNED = FileKind("tuned settings (tune's JSON)", "latticedraft tune", _is_tune_result)


def tune_out(a) -> Path:
    """The file ``tune`` writes: ``--out``, else ./tuned.json (./tuned-lookahead.json with --method lookahead)."""
    return a.out if a.out is not None else Path("tuned-lookahead.json" if a.method == "lookahead" else "tuned.json")


def _cmd_tune(a) -> int:
    import math

    from latticedraft.cli.checks import check_device, check_model_limits, check_ranges, refuse_given
    from latticedraft.decoding.eval.tune import GRID, tune
    from latticedraft.decoding.runs.session import Session
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.errors import InputError
    from latticedraft.paths import data_dir

    check_device(a.device)
    check_ranges(a)
    a.out = tune_out(a)  # claimed before the command started (output_options)
    if a.method == "lookahead":
        return _cmd_tune_lookahead(a)
    refuse_given(a, TUNE_LOOKAHEAD, "--method bpd tunes the interpolation weight alpha (those options apply to "
                                    "--method lookahead)")
    for g in a.grid or []:
        if not (math.isfinite(g) and g >= 0):
            raise InputError(f"--grid {g}: alphas must be finite numbers >= 0, e.g. --grid 0.5 1 2")
    prompts = read_prompts(a.prompts or data_dir() / "prompts.jsonl")
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads)
    s.notify = lambda m: print(m, file=sys.stderr)
    check_model_limits(a, s.model)
    out = tune(s, prompts, a.out, families=a.drafters, grid=a.grid or GRID, num_prompts=a.num_prompts,
               max_new_tokens=a.max_new_tokens, k=a.k, batch_size=a.batch_size, skip=a.skip)
    for f, sw in out["sweep"].items():
        print(f"{f:>7}: " + "  ".join(f"a={al}:{be:.3f}" for al, be in sw.items()) + f"   best a = {out['alphas'][f]}")
    print(f"wrote {a.out}; evaluate on other prompts, e.g. `latticedraft eval --alphas {a.out} --skip {a.skip + a.num_prompts}`")
    return 0


TUNE_LOOKAHEAD = ("windows", "ngrams", "pools", "prompt_as_reference", "verify")


TUNE_ALPHA = ("drafters", "grid", "k", "lm", "rescorer")


def _cmd_tune_lookahead(a) -> int:
    """``tune --method lookahead``: (W, N, G) from measured tokens per step and the cost model."""
    from latticedraft.cli.checks import refuse_given
    from latticedraft.decoding.eval.tune_lookahead import NGRAMS, POOLS, WINDOWS, check_grid, tune_lookahead
    from latticedraft.decoding.runs.session import Session
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.paths import data_dir

    refuse_given(a, TUNE_ALPHA, "--method lookahead tunes W, N and G (those options tune alpha, --method bpd)")
    windows, ngrams, pools = a.windows or WINDOWS, a.ngrams or NGRAMS, a.pools or POOLS
    check_grid(windows, ngrams, pools)
    prompts = read_prompts(a.prompts or data_dir() / "prompts.jsonl")
    s = Session(a.model, a.tokenizer, None, None, a.device, a.threads)
    out = tune_lookahead(s, prompts, a.out, windows=windows, ngrams=ngrams, pools=pools, num_prompts=a.num_prompts,
                         skip=a.skip, max_new_tokens=a.max_new_tokens, batch_size=a.batch_size,
                         prompt_as_reference=a.prompt_as_reference, verify=a.verify)
    print(f"{'W':>3} {'N':>3} {'G':>3} {'tokens/step':>11} {'nodes/step':>10} {'predicted tokens/s':>18}")
    for r in out["table"]:
        print(f"{r['W']:>3} {r['N']:>3} {r['G']:>3} {r['tokens_per_step']:>11.3f} {r['nodes_per_step']:>10.1f} "
              f"{r['predicted_tokens_per_s']:>18.1f}")
    c = out["lookahead"]
    print(f"best: W={c['W']} N={c['N']} G={c['G']}, predicted {out['predicted_tokens_per_s']:.1f} tokens/s")
    print(f"wrote {a.out}; use it with `latticedraft decode --method lookahead --lookahead-config {a.out}`, "
          f"evaluate with `latticedraft eval --lookahead-config {a.out} --skip {a.skip + a.num_prompts}`")
    return 0


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_file

    p = groups.add_parser("tune", help="tune alpha (Appendix E) or lookahead's (W, N, G)",
                          description="Sweep the interpolation weight alpha of the n-gram and neural drafters on a "
                                      "tuning split of the prompts and write the best per drafter as JSON "
                                      "(read by `eval --alphas` and `demo --alphas`); with --method lookahead, "
                                      "choose (W, N, G) by tokens per step and the measured step cost T(n) "
                                      "(read by `decode/eval --lookahead-config`).")
    p.add_argument("--method", default="bpd", choices=["bpd", "lookahead"],
                   help="bpd: alpha per drafter family (default); lookahead: W, N, G")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="prompt set (default data/prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, default=10, help="prompts in the tuning split (default 10)")
    p.add_argument("--skip", type=int, default=0, help="the split starts after the first N prompts (default 0)")
    p.add_argument("--drafters", nargs="+", default=["ngram", "neural"], choices=["ngram", "neural"],
                   help="drafter families to tune")
    p.add_argument("--grid", type=float, nargs="+", default=None, help="alphas (default 0.1 0.5 0.75 0.9 1.0 1.1 1.5 2.0 5.0 10.0)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per prompt (default 48)")
    p.add_argument("--batch-size", type=int, default=4, help="prompts decoded together (default 4)")
    p.add_argument("--k", type=int, default=16, help="candidates per head (default 16)")
    p.add_argument("--lm", default=None, metavar="DIR", help="n-gram LM build (default: the bundled 4-gram)")
    p.add_argument("--rescorer", default=None, metavar="DIR", help="neural rescorer (default data/rescorer-small)")
    g = p.add_argument_group("lookahead grid (--method lookahead)")
    g.add_argument("--windows", type=int, nargs="+", default=None, metavar="W", help="W values (default 3 7 15)")
    g.add_argument("--ngrams", type=int, nargs="+", default=None, metavar="N", help="N values (default 3 4 5)")
    g.add_argument("--pools", type=int, nargs="+", default=None, metavar="G", help="G values (default 3 7 15)")
    g.add_argument("--prompt-as-reference", action="store_true",
                   help="tune (and record) lookahead with the prompt as reference")
    g.add_argument("--verify", default="auto", choices=["auto", "tree", "batched"],
                   help="verify mode of the decodes and the cost model (default auto)")
    common_model_args(p)
    out_file(p, TUNED, inputs=("prompts", "model", "tokenizer", "lm", "rescorer"), target=tune_out, default=None,
             help="output file (default ./tuned.json; ./tuned-lookahead.json with --method lookahead)")
    p.add_argument("--force", action="store_true", help="replace a file an earlier `tune` wrote at --out")
    p.set_defaults(func=_cmd_tune)
