"""``latticedraft eval``: every drafter on a prompt set (the paper's tables and figures), the DynaMo ablation, or a summary of a data-set run's records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from latticedraft.cli.args import (
    common_model_args,
    drafter_args,
    dynamo_args,
    gamma_arg,
    lookahead_args,
    sampling_args,
    early_layer_args,
    set_threads,
    source_args,
)


def _dests(flags) -> tuple:
    """The argparse destinations of long flags (``--heldout-tokens`` -> ``heldout_tokens``)."""
    return tuple(f[2:].replace("-", "_") for f in flags)


ABLATION_FLAGS = {  # flag -> argparse keywords of the DynaMo ablation's own options (eval --method dynamo)
    "--epsilons": dict(type=float, nargs="+", default=None, help="ε_b grid (default 0.0 0.1 … 1.0)"),
    "--variants": dict(nargs="+", default=None, help="variants (default CO+AT+G3 CO+AT CO CO-0.5+AT+G3 AT+G3)"),
    "--seeds": dict(type=int, nargs="+", default=[0], help="sampling seeds per prompt (default 0)"),
    "--heldout-tokens": dict(type=int, default=16384, help="held-out tokens for PPL_n / PPL_1:n (0: skip)"),
    "--dynamic-tokens": dict(type=int, default=2048, help="held-out tokens for PPL_d per ε_b (default 2048)"),
}
ABLATION = _dests(ABLATION_FLAGS)  # their dests (refused for --method bpd)
SHARED_FLAGS = {  # flag -> argparse keywords of options the ablation shares with eval --method bpd
    "--num-prompts": dict(type=int, default=20, help="first N prompts of the file (default 20)"),
    "--out": dict(type=Path, default=Path("dynamo-eval"), help="output directory (default ./dynamo-eval)"),
    "--max-new-tokens": dict(type=int, default=48, help="tokens per generation (default 48)"),
    "--prompts": dict(default=None, help="prompt JSONL (default data/prompts.jsonl)"),
    "--model": dict(default=None, help="DynaMo head checkpoint (default data/heads-dynamo)"),
}


def _dynamo_eval_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``eval --method dynamo`` (the ablation); options the parser already has are left to it."""
    dynamo_args(p)
    have = set(p._option_string_actions)
    g = p.add_argument_group("DynaMo ablation (--method dynamo)")
    for flag, kw in {**ABLATION_FLAGS, **SHARED_FLAGS}.items():
        if flag not in have:
            g.add_argument(flag, **kw)


def _cmd_eval_dynamo(a, base) -> int:
    """``eval --method dynamo``: ε_b × variants ablation, quality proxy, held-out perplexities; table + PNG."""
    from latticedraft.decoding.dynamo.evaluate import EPSILONS, evaluate
    from latticedraft.decoding.dynamo.config import VARIANTS

    set_threads(a)
    res, paths = evaluate(
        model_dir=getattr(a, "model", None), prompts_file=getattr(a, "prompts", None), out_dir=a.out,
        tokenizer_path=getattr(a, "tokenizer", None), cooccurrence=a.cooccurrence, num_prompts=a.num_prompts,
        seeds=a.seeds, max_new_tokens=getattr(a, "max_new_tokens", 48) or 48, epsilons=a.epsilons or EPSILONS,
        variants=a.variants or VARIANTS, heldout_tokens=a.heldout_tokens, dynamic_tokens=a.dynamic_tokens,
        base=base, device=getattr(a, "device", None), notify=lambda m: print(m, file=sys.stderr))
    print(paths["table"].read_text())
    print(f"wrote {paths['json']}, {paths['table']}, {paths['plot']}")
    return 0


TABLE_FLAGS = {  # flag -> argparse keywords of eval --method bpd's own options (refused for the ablation)
    "--skip": dict(type=int, default=0, help="skip the first N prompts (the tuning split of `tune`)"),
    "--truncate-left": dict(type=int, default=None, metavar="N",
                            help="keep the last N tokens of each prompt (default: refuse a prompt that does not fit)"),
    "--batch-size": dict(type=int, default=4, help="prompts decoded together (default 4)"),
    "--alphas": dict(default=None, metavar="tuned.json", help="alphas from `latticedraft tune` (else --alpha for all; neither: the n-gram rows learn it)"),
    "--lm2": dict(default=None, metavar="DIR", help="2-gram build for Table 3 (default: the --lm model)"),
    "--rescorers": dict(nargs="+", default=None, metavar="LABEL=DIR",
                        help="neural rescorers, one Table 4 column each (default: --rescorer)"),
}
TABLES = _dests(TABLE_FLAGS)  # their dests
ROWS = ("bpd", "lookahead", "kangaroo", "ppd")  # the methods of eval --method bpd's rows


def _cmd_eval(a) -> int:
    """``eval``: every drafter on a prompt set; results.json, results.md, Figure 6 and 7 PNGs."""
    from latticedraft.cli.checks import (check_model_limits, check_ranges, given_dests, option_values, refuse_given,
                                         sampling_for)
    from latticedraft.decoding import registry

    if a.records is not None:
        return _cmd_eval_records(a)
    check_ranges(a)  # --out was claimed before the command started (output_options)
    values, given_ = option_values(a), given_dests(a)
    rows = [registry.get(m) for m in ROWS]
    dynamo = registry.get("dynamo")
    if a.method == "dynamo":
        refuse_given(a, sorted({d for m in rows for d in m.options} - set(dynamo.options)) + list(TABLES) + ["top_p"],
                     "eval --method dynamo runs the DynaMo ablation (those options apply to --method bpd)")
        return _cmd_eval_dynamo(a, dynamo.configure(values, given_).config)
    refuse_given(a, dynamo.options + ABLATION,
                 "the DynaMo ablation options apply to --method dynamo (eval --method bpd samples with --do-sample)")
    sampling = sampling_for(a, rows[0])
    from latticedraft.decoding.eval.evaluate import EvalConfig, evaluate
    from latticedraft.decoding.eval.tune import read_alphas
    from latticedraft.decoding.runs.prompt_set import read_prompts
    from latticedraft.decoding.runs.session import Session
    from latticedraft.errors import InputError
    from latticedraft.paths import data_dir

    for flag, value, default in (("--drafter", a.drafter, "top1"), ("--slots", a.slots, None)):
        if value != default:
            raise InputError(f"{flag} {value}: eval runs every drafter (and Table 10's head counts) itself; "
                             f"drop {flag}, or use `latticedraft decode` for one drafter")
    rows[0].configure({**values, "drafter": "parallel"}, set())  # the lattice options' ranges
    look, kangaroo, ppd = (m.configure(values, {d for d in given_ if m.reads(d)}) for m in rows[1:])
    sources = _sources(a, values, given_)
    # (without --alpha or --alphas the n-gram rows learn their weight as `decode` does; the neural one takes 1.0)
    alphas = read_alphas(a.alphas) if a.alphas else {"ngram": a.alpha if "alpha" in given_ else None,
                                                     "neural": a.alpha if "alpha" in given_ else 1.0}
    rescorers = {}
    for spec in a.rescorers or []:
        label, _, path = spec.partition("=")
        rescorers[f"neural-{label}" if path else "neural"] = path or label
    cfg = EvalConfig(num_prompts=a.num_prompts, skip=a.skip, max_new_tokens=a.max_new_tokens, k=a.k, nbest=a.nbest,
                     prune=a.prune, eps=a.eps, backoff=a.backoff, verify=a.verify,
                     alphas=alphas, batch_size=a.batch_size, lm2=a.lm2, rescorers=rescorers,
                     lookahead=look, kangaroo=kangaroo, ppd=ppd, sampling=sampling, truncate_left=a.truncate_left,
                     sources=sources)
    prompts = read_prompts(a.prompts or data_dir() / "prompts.jsonl")
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads)
    s.notify = lambda m: print(m, file=sys.stderr)
    check_model_limits(a, s.model)
    paths = evaluate(s, prompts, cfg, a.out, notify=lambda m: print(m, file=sys.stderr))
    print(paths["table"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _sources(a, values: dict, given_: set) -> dict:
    """dest -> value of each draft source the options turn on (the "Base + source" rows), checked as
    ``decode`` checks them (``--method bpd``'s option check, then before any model loads against the
    model's config.json: ``sources.check_config``)."""
    from latticedraft.decoding import registry
    from latticedraft.decoding import sources as draft_sources

    dests = {s.dest for s in draft_sources.sources()}
    spec = registry.get("bpd").configure({**values, "drafter": "top1"}, given_ & (dests | {"verify"}))
    draft_sources.check_config(spec, a.model, a.device)
    return {s.dest: getattr(spec, s.dest) for s in draft_sources.sources() if s.on(spec)}


def _cmd_eval_records(a) -> int:
    """``eval --records OUT.jsonl``: a ``decode --output`` run per rank and in total."""
    from latticedraft.cli.checks import given, refuse_given
    from latticedraft.decoding.runs import rank_summary

    refuse_given(a, [d for d in a._defaults if d not in ("records", "out", "force")],
                 "eval --records summarizes a finished decode --output run (only --out and --force apply)")
    if not given(a, "out"):
        refuse_given(a, ("force",), "eval --records writes files only with an explicit --out")
    summary = rank_summary.summarize(rank_summary.read_records(a.records))
    print(rank_summary.table(summary))
    if given(a, "out"):
        paths = rank_summary.write(summary, a.out)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _writes(a):
    """What ``eval`` writes into ``--out``: the tables, the DynaMo ablation, or with ``--records`` a
    summary (only where ``--out`` was given)."""
    from latticedraft.cli.checks import given
    from latticedraft.outputs import DYNAMO_EVAL, EVAL_RECORDS, EVAL_REPORT

    if a.records is not None:
        return EVAL_RECORDS if given(a, "out") else None
    return DYNAMO_EVAL if a.method == "dynamo" else EVAL_REPORT


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_dir
    from latticedraft.outputs import DYNAMO_EVAL, EVAL_RECORDS, EVAL_REPORT

    p = groups.add_parser("eval", help="every method and drafter on a prompt set: the paper's tables",
                          description="Evaluate on a prompt set (after --skip, the split `tune` uses): every BPD "
                                      "drafter of the paper's Tables 3, 4, 5 and 10 and Figures 6 and 7, and the "
                                      "lookahead, Kangaroo and PPD rows, beside plain greedy decoding: block "
                                      "efficiency, tokens/s and whether each output equals greedy decoding's (rows "
                                      "sampled with --do-sample are not compared). Writes results.json, results.md "
                                      "and the figures into --out. --method dynamo runs the DynaMo ablation instead; "
                                      "--records OUT.jsonl summarizes a `decode --output` run.")
    p.add_argument("--method", default="bpd", choices=["bpd", "dynamo"], help="bpd (default) or the DynaMo ablation")
    p.add_argument("--records", default=None, metavar="OUT.jsonl",
                   help="instead: summarize a `decode --output` run, per rank and in total (block efficiency, "
                        "tokens/s); writes records.json and records.md only with an explicit --out")
    p.add_argument("--force", action="store_true",
                   help="replace what an earlier eval of the same kind wrote in --out (results.json and the figures; "
                        "with --records: records.json and records.md)")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="{\"prompt\", \"reference\"?} per line (default data/prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, default=20, help="prompts evaluated (default 20)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default 64)")
    for flag, kw in TABLE_FLAGS.items():
        p.add_argument(flag, **kw)
    common_model_args(p)
    out_dir(p, (EVAL_REPORT, DYNAMO_EVAL, EVAL_RECORDS), pick=_writes, default=Path("out/eval"),
            inputs=("prompts", "records", "model", "tokenizer", "lm", "lm2", "rescorer", "alphas",
                    "draft_model", "adapter", "exit_heads", "lookahead_config"),
            help="output directory for results.json, results.md and the figures (default ./out/eval)")
    drafter_args(p)
    source_args(p, "draft sources: one \"Base + source\" row each (the top1 drafter with that source beside it)")
    lookahead_args(p)
    early_layer_args(p)
    gamma_arg(p)
    sampling_args(p)
    _dynamo_eval_args(p)
    p.set_defaults(func=_cmd_eval)
