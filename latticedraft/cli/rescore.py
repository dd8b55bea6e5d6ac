"""``latticedraft rescore``: the p best drafts of a saved lattice as JSON."""

from __future__ import annotations

import sys

from latticedraft.cli.args import add_ids, parse_ids


def _cmd_rescore(a) -> int:
    import json

    from latticedraft.lattice.rescoring import rescore_file

    res = rescore_file(a.lattice, a.lm, alpha=a.alpha, nbest=a.nbest, history=parse_ids(a.history, "--history"),
                       method=a.method)
    if res["truncated"]:
        print(f"note: the lattice has only {len(res['paths'])} paths; returning all of them", file=sys.stderr)
    print(json.dumps(res))
    return 0


def add_parser(groups) -> None:
    p = groups.add_parser("rescore", help="the p best paths of a saved lattice under an n-gram LM (JSON)",
                          description="Rescore a sausage lattice (.npz from Sausage.save) with an n-gram LM (score = head_logp + "
                                      "alpha * lm_logp, given the --history before it) and print the p best distinct "
                                      "paths as JSON.")
    p.add_argument("--lm", required=True, metavar="DIR", help="n-gram build directory (latticedraft lm build)")
    p.add_argument("--lattice", required=True, metavar="FILE.npz", help="lattice written by Sausage.save")
    p.add_argument("--alpha", type=float, default=1.0, help="LM weight: score = head_logp + alpha * lm_logp (default 1)")
    p.add_argument("--nbest", type=int, default=1, help="number of distinct drafts (default 1)")
    add_ids(p, "--history", "emitted token ids before the lattice, e.g. 12,7,99 (default: the file's 'history', "
                             "else <s>)")
    p.add_argument("--method", default="exact", choices=["exact", "wfst"],
                   help="exact (back-off semantics, default) or wfst (OpenFST compose + n-shortest, epsilon back-off)")
    p.set_defaults(func=_cmd_rescore)
