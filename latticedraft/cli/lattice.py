"""``latticedraft lattice draw``: a saved lattice as a picture."""

from __future__ import annotations

from latticedraft.cli.args import add_ids, parse_ids
from latticedraft.outputs import FileKind


def _cmd_lattice_draw(a) -> int:
    from latticedraft.lattice.draw import draw_file

    out = draw_file(a.lattice, a.out, tokenizer=a.tokenizer, reference=parse_ids(a.reference, "--reference"), lm=a.lm,
                    alpha=a.alpha, history=parse_ids(a.history, "--history"))
    print(out)
    return 0


def _is_drawn(path) -> bool:
    from latticedraft.lattice.draw import is_drawn

    return is_drawn(path)


DRAWN = FileKind("a lattice picture", "latticedraft lattice draw", _is_drawn)


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_file

    p = groups.add_parser("lattice", help="draw a saved sausage lattice (PNG)",
                          description="Inspect sausage lattices saved with Sausage.save.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="<verb>")
    d = sub.add_parser("draw", help="draw a lattice like Figure 4 of the BPD paper (PNG)",
                       description="Draw a lattice: one column per slot, arcs by weight with token text and score; "
                                   "the chosen path in blue, the reference in green.")
    d.add_argument("lattice", metavar="LATTICE.npz", help="lattice written by Sausage.save")
    out_file(d, DRAWN, inputs=("lattice", "tokenizer", "lm"), required=True, metavar="OUT.png",
             help="output file: the PNG picture to write")
    d.add_argument("--force", action="store_true", help="replace a picture an earlier `lattice draw` wrote at --out")
    d.add_argument("--tokenizer", default=None, metavar="PATH", help="tokenizer.json for token text (default: ids)")
    add_ids(d, "--reference", "the target's tokens (default: the file's 'reference')")
    d.add_argument("--lm", default=None, metavar="DIR", help="choose the path by rescoring with this n-gram (default: "
                                                             "the file's 'chosen', else top-1)")
    d.add_argument("--alpha", type=float, default=1.0, help="LM weight with --lm (default 1)")
    add_ids(d, "--history", "history for --lm (default: the file's 'history')")
    d.set_defaults(func=_cmd_lattice_draw)
