"""``latticedraft lm build | score | convert | index | cooccurrence``: n-gram LMs over token ids."""

from __future__ import annotations

from pathlib import Path

from latticedraft.cli.args import add_ids, parse_ids, stdin_corpus
from latticedraft.outputs import FileKind


def _cmd_lm_build(a) -> int:
    from latticedraft.lm.build import BuildOptions, build, validate

    opts = BuildOptions(
        corpus=a.corpus, out=a.out, order=a.order, prune=a.prune, tokenizer=a.tokenizer,
        train_tokenizer=a.train_tokenizer, memory=a.memory, temp_dir=a.temp_dir, force=a.force,
        encoding_errors=a.encoding_errors, unk_cost=a.unk_cost, sentences=a.sentences,
    )
    validate(opts)  # before reading standard input
    with stdin_corpus(a.corpus) as corpus:
        opts.corpus = corpus
        m = build(opts)
    f = m["fst"]
    print(f"built {m['order']}-gram LM in {a.out}: {m['corpus']['tokens']} tokens, n-grams "
          f"{'/'.join(map(str, m['ngram_counts']))}, WFST {f['states']} states {f['arcs']} arcs"
          f"{' (lmplz needed --discount_fallback)' if m['lmplz']['discount_fallback'] else ''}; "
          f"{m['timings_s']['total_s']:.1f} s")
    return 0


def _cmd_lm_score(a) -> int:
    import json

    from latticedraft.errors import InputError
    from latticedraft.lm.ngram import NgramLM

    if (a.text is None) == (a.ids is None):
        raise InputError("give exactly one of --text TEXT or --ids ID [ID ...]")
    ids, history = parse_ids(a.ids, "--ids"), parse_ids(a.history, "--history") or []
    lm = NgramLM.load(a.lm, unk_cost=a.unk_cost)
    if a.text is not None:
        from latticedraft.textin import read_text_arg

        text = read_text_arg("-", "--text", "pipe UTF-8 text into --text -") if a.text == "-" else a.text
        ids = lm.tokenizer.encode(text, add_special_tokens=False).ids
    lp = lm.score(ids, history=history)
    vocab = lm.vocab
    out = {"lm": str(a.lm), "order": lm.order, "history": list(history),
           "tokens": [{"id": int(t), "token": vocab[int(t)], "logprob": float(x)} for t, x in zip(ids, lp)],
           "total_logprob": float(lp.astype("float64").sum())}
    print(json.dumps(out, indent=None if a.compact else 2, ensure_ascii=False))
    return 0


def _cmd_lm_index(a) -> int:
    import time

    from latticedraft.lm.build import read_manifest
    from latticedraft.lm.ngram import ensure_tables

    m = read_manifest(a.dir)
    t0 = time.perf_counter()
    wrote = ensure_tables(a.dir, m, force=a.force, notice=False)
    print(f"{'wrote' if wrote else 'already present (--force rewrites):'} {a.dir}/tables"
          f"{f' in {time.perf_counter() - t0:.1f} s' if wrote else ''}")
    return 0


def _cmd_lm_convert(a) -> int:
    import time

    from latticedraft.errors import InputError
    from latticedraft.lm.build import MAX_VOCAB
    from latticedraft.lm.wfst import arpa_to_fst, check_unk_cost, fst_bytes
    from latticedraft.memory import check_fits

    check_unk_cost(a.unk_cost)
    if a.vocab_size is not None:
        if not 1 <= a.vocab_size <= MAX_VOCAB:
            raise InputError(f"--vocab-size {a.vocab_size} is outside 1..{MAX_VOCAB} (token ids label the WFST as "
                             "int32, id + 1)")
        check_fits({"--vocab-size": a.vocab_size}, lambda s: fst_bytes(s["--vocab-size"]),
                   doing="for the WFST's arrays (its unigram state has an arc per id)")
    if not a.out.parent.is_dir():
        raise InputError(f"the directory of --out {a.out} does not exist; create it first")
    t0 = time.perf_counter()
    f = arpa_to_fst(a.arpa, a.out, vocab_size=a.vocab_size, unk_cost=a.unk_cost)
    print(f"wrote {a.out} (+ {a.out.with_suffix('.npz').name}): order {f.order}, {f.vocab_size} labels, "
          f"{f.num_states} states, {f.num_arcs} arcs in {time.perf_counter() - t0:.2f} s")
    return 0


def _is_fst_file(p) -> bool:
    from latticedraft.lm.wfst import is_fst_file

    return is_fst_file(p)


def _is_fst_npz(p) -> bool:
    from latticedraft.lm.wfst import is_fst_npz

    return is_fst_npz(p)


def _read_manifest(d) -> dict:
    from latticedraft.lm.build import read_manifest

    return read_manifest(d)


FST_FILE = FileKind("an OpenFst LM (lm.fst)", "latticedraft lm convert", _is_fst_file)
FST_NPZ = FileKind("the CSR cache of an LM (lm.npz)", "latticedraft lm convert", _is_fst_npz)


def _claim_index(a) -> None:
    """``lm index DIR``'s rule: DIR is an LM build whose tables/ can be written, before any work."""
    from latticedraft.paths import check_writable

    _read_manifest(a.dir)
    check_writable(Path(a.dir) / "tables", "DIR", "directory")


def _claim_cooccurrence(a) -> None:
    """``lm cooccurrence --lm DIR``'s rule: DIR is an LM build and its ``cooccurrence.npz`` is new, or a
    table replaced with ``--force`` (``cooccurrence_output``); before standard input is read."""
    from latticedraft.lm.cooccurrence import cooccurrence_output

    cooccurrence_output(a.lm, a.force)
    _read_manifest(a.lm)


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import FILE, IN_PLACE, Output, declare, out_dir, out_file
    from latticedraft.outputs import LM_BUILD
    from latticedraft.paths import default_lm_dir

    g = groups.add_parser("lm", help="n-gram LMs: build, score, convert and index; co-occurrences",
                          description="Build, score, convert and index n-gram LMs over token ids (KenLM → ARPA → "
                                      "binary → WFST), and count token co-occurrences for DynaMo.")
    sub = g.add_subparsers(dest="verb", required=True, metavar="<verb>")
    b = sub.add_parser("build", help="build an n-gram LM over token ids from corpus files",
                       description="Tokenize a corpus, count and estimate an n-gram LM with KenLM's lmplz, and "
                                   "write lm.arpa, lm.bin, lm.fst (+ lm.npz), tokenizer.json and manifest.json "
                                   "into --out. The build happens in a temporary directory renamed into place, "
                                   "so a failed or interrupted build leaves nothing behind.")
    b.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                   help="text files (.gz and .xz too), directories, stdlib / stdlib:train / stdlib:heldout, or - for "
                        "standard input")
    out_dir(b, LM_BUILD, inputs=("corpus", "tokenizer"), required=True,
            help="build directory to create (must not hold a build unless --force)")
    b.add_argument("--order", type=int, default=3, help="n-gram order, 2..6 (default 3)")
    b.add_argument("--prune", type=int, nargs="+", metavar="N",
                   help="lmplz count thresholds per order: drop n-grams seen at most N times, e.g. 0 0 1 3 "
                        "(default: no pruning)")
    t = b.add_mutually_exclusive_group(required=True)
    t.add_argument("--tokenizer", metavar="PATH", help="HF tokenizer.json (or its directory) of the target model")
    t.add_argument("--train-tokenizer", type=int, metavar="VOCAB_SIZE", help="train a byte-level BPE on the corpus")
    b.add_argument("--memory", default="512M", help="lmplz/build_binary sorting memory, e.g. 512M, 4G, 20%% (default 512M)")
    b.add_argument("--temp-dir", type=Path, help="where lmplz puts its temporary files (default: the build directory)")
    b.add_argument("--force", action="store_true",
                   help="replace an existing LM build in --out (one with manifest.json; files you added there are "
                        "kept; any other directory is refused)")
    b.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                   help="non-UTF-8 bytes in the corpus: fail naming the byte (strict) or replace them")
    b.add_argument("--unk-cost", type=float, default=1000.0, help="cost (-ln p) of ids never seen, >= 0 (default 1000)")
    b.add_argument("--sentences", choices=["lines", "paragraphs", "files"], default=None,
                   help="the LM's sentence unit (<s> ... </s>): each line (KenLM's convention), each blank-line "
                        "paragraph, or each file (default: paragraphs when .py code is most of the corpus by bytes, "
                        "else lines; the manifest records which)")
    b.set_defaults(func=_cmd_lm_build)
    s = sub.add_parser("score", help="per-token natural-log probabilities as JSON",
                       description="Score text (tokenized with the LM's tokenizer; - reads standard input) or token "
                                   "ids with an n-gram build; prints each token's natural-log probability as JSON.")
    s.add_argument("--lm", type=Path, default=default_lm_dir(), help="build directory (default: the bundled 4-gram)")
    s.add_argument("--text", help="text, tokenized with the LM's tokenizer; - reads standard input (default: --ids)")
    add_ids(s, "--ids", "token ids to score (instead of --text)")
    add_ids(s, "--history", "ids before the scored ones (default: start of sentence)")
    s.add_argument("--unk-cost", type=float, default=None,
                   help="re-price ids the LM never saw, a cost >= 0 in nats (default: the build's, 1000)")
    s.add_argument("--compact", action="store_true", help="one-line JSON")
    s.set_defaults(func=_cmd_lm_score)
    c = sub.add_parser("convert", help="an ARPA file over token ids → OpenFst binary lm.fst (+ lm.npz beside it)",
                       description="Convert an ARPA file whose words are token ids into the back-off WFST "
                                   "(OpenFst binary) and its CSR cache lm.npz beside it.")
    c.add_argument("arpa", type=Path, help="ARPA file (.gz too) whose words are token ids, as lmplz writes them here")
    out_file(c, FST_FILE, inputs=("arpa",), required=True, metavar="LM.FST",
             help="output file: the OpenFst binary (lm.npz is written beside it)")
    declare(c, Output("the .npz beside --out", "out", FILE, (FST_NPZ,), inputs=("arpa",),
                      target=lambda a: a.out.with_suffix(".npz")))
    c.add_argument("--vocab-size", type=int, help="V, the tokenizer's vocabulary size (default: largest id + 1)")
    c.add_argument("--unk-cost", type=float, default=1000.0,
                   help="cost of ids absent from the ARPA, >= 0 (default 1000)")
    c.add_argument("--force", action="store_true",
                   help="replace an existing --out (and the .npz beside it) that lm convert wrote")
    c.set_defaults(func=_cmd_lm_convert)
    x = sub.add_parser("index", help="write the memory-mapped search tables (tables/) into an older LM build",
                       description="Write DIR/tables/, the exact searches' arrays as .npy files that every process "
                                   "maps at load (lm build writes them; builds from before need this once).")
    x.add_argument("dir", type=Path, metavar="DIR", help="an LM build directory (holds manifest.json)")
    x.add_argument("--force", action="store_true", help="rewrite the tables even if present")
    declare(x, Output("DIR", "dir", IN_PLACE, (LM_BUILD,), claim=_claim_index))  # into a build
    x.set_defaults(func=_cmd_lm_index)
    _add_lm_cooccurrence(sub, b)


def _add_lm_cooccurrence(sub, build_parser) -> None:
    """``lm cooccurrence`` and ``lm build --cooccurrence`` (counts for DynaMo's co-occurrence mask)."""
    from latticedraft.cli.output_options import IN_PLACE, Output, declare
    from latticedraft.outputs import LM_BUILD

    c = sub.add_parser("cooccurrence",
                       help="count token pairs/triples for DynaMo's co-occurrence mask into an LM build",
                       description="Count token pairs and triples of a corpus (by default the LM build's own) for "
                                   "DynaMo's co-occurrence mask; writes cooccurrence.npz into the build directory.")
    c.add_argument("--lm", type=Path, required=True, metavar="DIR", help="LM build directory (its manifest names corpus and tokenizer)")
    c.add_argument("--corpus", nargs="+", metavar="FILE",
                   help="count these (- for standard input) instead of the build's corpus (default: the build's)")
    c.add_argument("--tokenizer", metavar="PATH", help="tokenizer instead of the build's tokenizer.json")
    c.add_argument("--force", action="store_true", help="replace an existing cooccurrence.npz")
    declare(c, Output("--lm", "lm", IN_PLACE, (LM_BUILD,), claim=_claim_cooccurrence))
    c.add_argument("--encoding-errors", choices=["strict", "replace"], default="strict",
                   help="non-UTF-8 bytes in the corpus: fail naming the byte (strict) or replace them")
    c.set_defaults(func=_cmd_lm_cooccurrence)
    build_parser.add_argument("--cooccurrence", action="store_true",
                              help="also count token co-occurrences (DynaMo's mask) into the build: cooccurrence.npz")
    build = build_parser.get_default("func")

    def build_then_count(a) -> int:
        rc = build(a)
        if rc == 0 and getattr(a, "cooccurrence", False):
            from latticedraft.lm.cooccurrence import build_for_lm_dir

            print(f"co-occurrence counts written to {build_for_lm_dir(a.out, force=True, encoding_errors=a.encoding_errors)}")
        return rc

    build_parser.set_defaults(func=build_then_count)


def _cmd_lm_cooccurrence(a) -> int:
    from latticedraft.lm.cooccurrence import CooccurrenceStats, build_for_lm_dir

    with stdin_corpus(a.corpus or []) as corpus:
        out = build_for_lm_dir(a.lm, tokenizer_path=a.tokenizer, corpus=corpus or None,
                               encoding_errors=a.encoding_errors, force=a.force)
    s = CooccurrenceStats.load(out)
    print(f"wrote {out}: {s.n_tokens[0]} tokens, {s.pairs[1].nnz} distinct pairs, {s.triple_keys.size} distinct triples, "
          f"vocabulary {s.vocab_size}")
    return 0
