"""``latticedraft <group> <verb>``: parses arguments, calls the library, prints results.

Thin by design: no algorithm lives here. Each group registers its sub-commands in an
``_add_<group>`` function; every command is a function ``(args) -> int``. User errors
(``LatticedraftError``) print as one line ``error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
import sys

from latticedraft.errors import LatticedraftError


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default (unless the text already states one)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (not action.option_strings or action.required or action.default is argparse.SUPPRESS
                or "default" in h.lower()):
            return h
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{h} (default: {'off' if action.default is False else 'on'})"
        d = action.default
        shown = "none" if d is None else " ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)
        return f"{h} (default: {shown.replace('%', '%%')})"


class _Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose help shows defaults; sub-command parsers inherit it."""

    def __init__(self, *args, **kw):
        kw.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message):
        """Usage, then one last line ``error: ...`` naming the option and where the help is (exit 2)."""
        self.print_usage(sys.stderr)
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def _commands(parser: argparse.ArgumentParser, path=()):
    """``(("lm", "build"), parser)`` for every leaf command under ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, p in subs[0].choices.items():
        yield from _commands(p, (*path, name))


def build_parser() -> argparse.ArgumentParser:
    from latticedraft import __version__

    parser = _Parser(prog="latticedraft", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"latticedraft {__version__}")
    groups = parser.add_subparsers(dest="group", required=True, metavar="<group>")
    for add in _GROUPS:
        add(groups)
    for _, p in _commands(parser):  # what cli_checks.given compares against
        opts = [x for x in p._actions if x.option_strings and x.dest != "help"]
        p.set_defaults(_defaults={x.dest: p.get_default(x.dest) for x in opts},
                       _flags={x.dest: max(x.option_strings, key=len) for x in opts})
    return parser


def _optim_args(p: argparse.ArgumentParser, steps: int, lr: float) -> None:
    g = p.add_argument_group("optimisation (AdamW β=(0.9, 0.95), ε=1e-8, cosine schedule)")
    g.add_argument("--steps", type=int, default=steps, help=f"optimizer updates (default {steps})")
    g.add_argument("--lr", type=float, default=lr, help=f"peak learning rate (default {lr})")
    g.add_argument("--batch-size", type=int, default=16, help="windows per micro-batch (default 16)")
    g.add_argument("--seq-len", type=int, default=256, help="tokens per window (default 256)")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per update (default 1)")
    g.add_argument("--warmup-frac", type=float, default=0.01, help="linear warm-up fraction of the steps (default 0.01)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    g.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default 100)")
    g.add_argument("--seed", type=int, default=0, help="seed for initialisation and batch order (default 0)")
    g.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same settings required)")
    g.add_argument("--stop-after", type=int, default=None, help="stop after N steps this run, leaving a checkpoint to --resume")
    g.add_argument("--save-dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="dtype of the saved weights")
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--encoding-errors", default="strict", choices=["strict", "replace"],
                   help="non-UTF-8 bytes in the corpus: fail naming the byte (strict) or replace them")


def _optim_config(a):
    from latticedraft.gpu.train import OptimConfig

    return OptimConfig(steps=a.steps, lr=a.lr, batch_size=a.batch_size, seq_len=a.seq_len, grad_accum=a.grad_accum,
                       warmup_frac=a.warmup_frac, weight_decay=a.weight_decay, checkpoint_every=a.checkpoint_every,
                       seed=a.seed)


def _print_trained(res, loss_label: str) -> int:
    """One line on a ``TrainResult``: where a ``--stop-after`` run stopped, or the final losses and output."""
    if not res.finished:
        print(f"stopped at step {res.steps}; continue with --resume")
        return 0
    print(f"trained {res.steps} steps ({res.tokens} tokens, {res.seconds} s); {loss_label} "
          + " ".join(f"{k}={v:.4f}" for k, v in res.losses.items()) + f"; saved to {res.out_dir}")
    return 0


def _check_train(a) -> None:
    """What ``train lm`` / ``train heads`` can check before reading the corpus or loading a model."""
    from latticedraft.cli_checks import at_least, check_device, finite
    from latticedraft.paths import check_writable

    check_device(a.device)
    check_writable(a.out, "--out", "directory")
    for d in ("steps", "batch_size", "seq_len", "grad_accum", "checkpoint_every", "stop_after", "sliding_window", "ffn_dim"):
        at_least(a, d, 1)
    for d in ("lr", "warmup_frac", "weight_decay"):
        finite(a, d)


def _cmd_train_lm(a) -> int:
    from latticedraft.gpu.train import LMArch, train_lm
    from latticedraft.lm.corpus import resolve_corpus

    _check_train(a)

    with _stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_lm(a.tokenizer, files, a.out,
                       LMArch(n_embd=a.n_embd, n_layer=a.n_layer, n_head=a.n_head, n_positions=a.n_positions,
                              family=a.family, sliding_window=a.sliding_window, ffn_dim=a.ffn_dim),
                       _optim_config(a), resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                       encoding_errors=a.encoding_errors, stop_after=a.stop_after)
    return _print_trained(res, "final loss")


def _cmd_train_heads(a) -> int:
    from latticedraft.gpu.train import train_heads
    from latticedraft.lm.corpus import resolve_corpus

    _check_train(a)
    if a.early_exit:
        return _cmd_train_exit_heads(a)
    if a.heads is None:
        from latticedraft.errors import InputError

        raise InputError("train heads needs --heads H (the number of heads), or --early-exit for PPD's per-layer heads")

    with _stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_heads(a.base, files, a.out, a.heads, a.kind, _optim_config(a), lambdas=a.lambdas,
                          unfreeze=a.unfreeze, lr_base=a.lr_base, lr_stem=a.lr_stem, ffn_dim=a.ffn_dim,
                          tokenizer_path=a.tokenizer, resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                          encoding_errors=a.encoding_errors, stop_after=a.stop_after)
    return _print_trained(res, "final loss per head")


def _cmd_train_exit_heads(a) -> int:
    """``train heads --early-exit``: PPD's per-layer early-exit heads (``gpu/exit_heads.py``)."""
    from latticedraft.cli_checks import refuse_given
    from latticedraft.gpu.self_draft_train import train_exit_heads
    from latticedraft.lm.corpus import resolve_corpus

    refuse_given(a, ("heads", "lambdas", "ffn_dim"), "--early-exit trains one head per layer by distillation")
    if a.kind != "stern" or a.unfreeze:
        from latticedraft.errors import InputError

        raise InputError("--early-exit trains early-exit heads on a frozen base; drop --kind and --unfreeze")
    with _stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_exit_heads(a.base, files, a.out, _optim_config(a), tokenizer_path=a.tokenizer, resume=a.resume,
                               save_dtype=a.save_dtype, device=a.device, encoding_errors=a.encoding_errors,
                               stop_after=a.stop_after)
    return _print_trained(res, "final distillation loss per layer")


def _cmd_train_adapter(a) -> int:
    """``train adapter``: Kangaroo's self-drafting adapter (``gpu/adapter.py``)."""
    from latticedraft.gpu.self_draft_train import train_adapter
    from latticedraft.lm.corpus import resolve_corpus

    _check_train(a)
    with _stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_adapter(a.base, files, a.out, a.exit_layer, _optim_config(a), tokenizer_path=a.tokenizer,
                            resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                            encoding_errors=a.encoding_errors, stop_after=a.stop_after)
    return _print_trained(res, "final")


def _train_corpus_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", nargs="+", required=True,
                   help="files, directories, stdlib / stdlib:train / stdlib:heldout, or - for standard input")


def _add_train(groups) -> None:
    grp = groups.add_parser("train", help="train a small causal LM or multi-token heads",
                            description="Train the models latticedraft decodes with: a small causal LM from scratch "
                                        "(`train lm`) or multi-token heads on a base LM (`train heads`).")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("lm", help="train a GPT-2- or Mistral-style causal LM from scratch (the base, the rescorers)",
                         description="Train a GPT-2- or Mistral-style causal LM from scratch on a corpus (files, directories or "
                                     "the standard library; - reads standard input) and save it in HF format with "
                                     "its tokenizer. Checkpoints every --checkpoint-every steps; --resume continues.")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory holding one")
    _train_corpus_arg(p)
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR",
                   help="output directory (HF format, loadable by AutoModelForCausalLM)")
    p.add_argument("--n-embd", type=int, default=256, help="hidden size")
    p.add_argument("--n-layer", type=int, default=4, help="decoder layers")
    p.add_argument("--n-head", type=int, default=4, help="attention heads per layer")
    p.add_argument("--n-positions", type=int, default=256, help="context length")
    p.add_argument("--family", choices=["gpt2", "mistral"], default="gpt2",
                   help="gpt2 (learned positions, GELU MLP) or mistral (RoPE, SwiGLU, optional sliding window)")
    p.add_argument("--sliding-window", type=int, default=None, metavar="W",
                   help="mistral: attend to the last W positions only (default: full causal attention)")
    p.add_argument("--ffn-dim", type=int, default=None, help="mistral: SwiGLU width (default 8/3 x --n-embd)")
    _optim_args(p, steps=500, lr=2e-3)
    p.set_defaults(func=_cmd_train_lm)
    p = verbs.add_parser("heads", help="train heads 2..h of a BlockwiseModel on a base causal LM (loss Σ λ_h L_h)",
                         description="Train multi-token heads (Stern FFN heads or DynaMo decoder-layer heads) on a "
                                     "frozen (or --unfreeze) base causal LM; saves heads_config.json and "
                                     "heads.safetensors, naming the base relatively.")
    p.add_argument("--base", required=True, help="base model directory (HF format)")
    _train_corpus_arg(p)
    p.add_argument("--heads", type=int, default=None, help="number of heads h, counting the base's own head 1 (≥ 2)")
    p.add_argument("--kind", choices=["stern", "dynamo"], default="stern", help="FFN heads (Stern) or decoder-layer heads (DynaMo)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR",
                   help="output directory (heads_config.json names the base relatively)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    p.add_argument("--lambdas", type=float, nargs="+", default=None, help="per-head loss weights λ_1..λ_h (default all 1)")
    p.add_argument("--unfreeze", action="store_true", help="train the base too, with DynaMo's three learning rates")
    p.add_argument("--lr-base", type=float, default=1e-5, help="LR_B: the base's own parameters (with --unfreeze)")
    p.add_argument("--lr-stem", type=float, default=1e-6, help="LR_MB: gradient from heads 2..h into the base (with --unfreeze)")
    p.add_argument("--ffn-dim", type=int, default=None, help="Stern head hidden width (default 4 × hidden size)")
    p.add_argument("--early-exit", action="store_true",
                   help="instead: one early-exit head per layer 1..d-1 for PPD (--method ppd --exit-heads DIR), "
                        "distilled from the full model")
    _optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_heads)
    p = verbs.add_parser("adapter", help="train Kangaroo's self-drafting adapter on the base's first l layers",
                         description="Train Kangaroo's adapter (one attention layer and two norms on the states after "
                                     "layer l, the base's LM head shared) by distillation from the frozen full model; "
                                     "saves adapter.json and adapter.safetensors (decode --method kangaroo --adapter DIR).")
    p.add_argument("--base", required=True, help="base model directory (HF format; GPT-2, LLaMA or Mistral style)")
    _train_corpus_arg(p)
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output directory")
    p.add_argument("--exit-layer", type=int, default=2, help="l: the adapter reads the states after layer l (default 2)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    _optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_adapter)


@contextlib.contextmanager
def _stdin_corpus(specs: list[str]):
    """``specs`` with ``-`` replaced by a temporary copy of standard input (``stdin.txt``)."""
    if "-" not in specs:
        yield list(specs)
        return
    import tempfile

    from latticedraft.textin import read_bytes_arg

    with tempfile.TemporaryDirectory(prefix="latticedraft-stdin-") as d:
        f = Path(d) / "stdin.txt"
        f.write_bytes(read_bytes_arg("-", "--corpus", "pipe the corpus text into --corpus -"))
        yield [str(f) if x == "-" else x for x in specs]


def _cmd_lm_build(a) -> int:
    from latticedraft.lm.build import BuildOptions, build, validate

    opts = BuildOptions(
        corpus=a.corpus, out=a.out, order=a.order, prune=a.prune, tokenizer=a.tokenizer,
        train_tokenizer=a.train_tokenizer, memory=a.memory, temp_dir=a.temp_dir, force=a.force,
        encoding_errors=a.encoding_errors, unk_cost=a.unk_cost, sentences=a.sentences,
    )
    validate(opts)  # before reading standard input
    with _stdin_corpus(a.corpus) as corpus:
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
    ids, history = _ids(a.ids, "--ids"), _ids(a.history, "--history") or []
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
    from latticedraft.lm.wfst import arpa_to_fst

    from latticedraft.lm.wfst import check_unk_cost
    from latticedraft.paths import check_writable

    check_unk_cost(a.unk_cost)
    check_writable(a.out, "--out", "file")
    if a.out.exists() and not a.force:
        raise InputError(f"--out {a.out} exists; pass --force to replace it")
    if not a.out.parent.is_dir():
        raise InputError(f"the directory of --out {a.out} does not exist; create it first")
    t0 = time.perf_counter()
    f = arpa_to_fst(a.arpa, a.out, vocab_size=a.vocab_size, unk_cost=a.unk_cost)
    print(f"wrote {a.out} (+ {a.out.with_suffix('.npz').name}): order {f.order}, {f.vocab_size} labels, "
          f"{f.num_states} states, {f.num_arcs} arcs in {time.perf_counter() - t0:.2f} s")
    return 0


def _add_lm(groups) -> None:
    from latticedraft.paths import default_lm_dir

    g = groups.add_parser("lm", help="n-gram LMs: build (KenLM → ARPA → binary → WFST) and score",
                          description="Build, score, convert n-gram LMs over token ids, and count co-occurrences.")
    sub = g.add_subparsers(dest="verb", required=True, metavar="<verb>")
    b = sub.add_parser("build", help="build an n-gram LM over token ids from corpus files",
                       description="Tokenize a corpus, count and estimate an n-gram LM with KenLM's lmplz, and "
                                   "write lm.arpa, lm.bin, lm.fst (+ lm.npz), tokenizer.json and manifest.json "
                                   "into --out. The build happens in a temporary directory renamed into place, "
                                   "so a failed or interrupted build leaves nothing behind.")
    b.add_argument("--corpus", nargs="+", required=True, metavar="FILE",
                   help="text files (.gz too), directories, stdlib / stdlib:train / stdlib:heldout, or - for "
                        "standard input")
    b.add_argument("-o", "--out", type=Path, required=True, metavar="DIR",
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
    b.add_argument("--force", action="store_true", help="replace an existing build in --out")
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
    _add_ids(s, "--ids", "token ids to score (instead of --text)")
    _add_ids(s, "--history", "ids before the scored ones (default: start of sentence)")
    s.add_argument("--unk-cost", type=float, default=None,
                   help="re-price ids the LM never saw, a cost >= 0 in nats (default: the build's, 1000)")
    s.add_argument("--compact", action="store_true", help="one-line JSON")
    s.set_defaults(func=_cmd_lm_score)
    c = sub.add_parser("convert", help="an ARPA file over token ids → OpenFst binary lm.fst (+ lm.npz beside it)",
                       description="Convert an ARPA file whose words are token ids into the back-off WFST "
                                   "(OpenFst binary) and its CSR cache lm.npz beside it.")
    c.add_argument("arpa", type=Path, help="ARPA file (.gz too) whose words are token ids, as lmplz writes them here")
    c.add_argument("-o", "--out", type=Path, required=True, metavar="LM.FST",
                   help="output file: the OpenFst binary (lm.npz is written beside it)")
    c.add_argument("--vocab-size", type=int, help="V, the tokenizer's vocabulary size (default: largest id + 1)")
    c.add_argument("--unk-cost", type=float, default=1000.0,
                   help="cost of ids absent from the ARPA, >= 0 (default 1000)")
    c.add_argument("--force", action="store_true", help="replace an existing --out")
    c.set_defaults(func=_cmd_lm_convert)
    x = sub.add_parser("index", help="write the memory-mapped search tables (tables/) into an older LM build",
                       description="Write DIR/tables/, the exact searches' arrays as .npy files that every process "
                                   "maps at load (lm build writes them; builds from before need this once).")
    x.add_argument("dir", type=Path, metavar="DIR", help="an LM build directory (holds manifest.json)")
    x.add_argument("--force", action="store_true", help="rewrite the tables even if present")
    x.set_defaults(func=_cmd_lm_index)
    _add_lm_cooccurrence(sub, b)


# ---------------------------------------------------------------- DynaMo (issue 6): lm cooccurrence, decode/eval --method dynamo


def _add_lm_cooccurrence(sub, build_parser) -> None:
    """``lm cooccurrence`` and ``lm build --cooccurrence`` (counts for DynaMo's co-occurrence mask)."""
    c = sub.add_parser("cooccurrence",
                       help="count token pairs/triples for DynaMo's co-occurrence mask into an LM build",
                       description="Count token pairs and triples of a corpus (by default the LM build's own) for "
                                   "DynaMo's co-occurrence mask; writes cooccurrence.npz into the build directory.")
    c.add_argument("--lm", type=Path, required=True, metavar="DIR", help="LM build directory (its manifest names corpus and tokenizer)")
    c.add_argument("--corpus", nargs="+", metavar="FILE",
                   help="count these (- for standard input) instead of the build's corpus (default: the build's)")
    c.add_argument("--tokenizer", metavar="PATH", help="tokenizer instead of the build's tokenizer.json")
    c.add_argument("--force", action="store_true", help="replace an existing cooccurrence.npz")
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

    with _stdin_corpus(a.corpus or []) as corpus:
        out = build_for_lm_dir(a.lm, tokenizer_path=a.tokenizer, corpus=corpus or None,
                               encoding_errors=a.encoding_errors, force=a.force)
    s = CooccurrenceStats.load(out)
    print(f"wrote {out}: {s.n_tokens[0]} tokens, {s.pairs[1].nnz} distinct pairs, {s.triple_keys.size} distinct triples, "
          f"vocabulary {s.vocab_size}")
    return 0


def _dynamo_sampler_args(p: argparse.ArgumentParser) -> None:
    """DynaMo's sampling flags (paper defaults, Appendix A.1); options the parser already has are left to it."""
    have = set(p._option_string_actions)

    def add(flag, **kw):
        if flag not in have:
            p.add_argument(flag, **kw)

    g = p.add_argument_group("DynaMo sampling (--method dynamo)")

    def addg(flag, **kw):
        if flag not in have:
            g.add_argument(flag, **kw)

    addg("--epsilon-b", type=float, default=0.5, help="back-off threshold ε_b in [0, 1]: 0 always emits n tokens, 1 always one (default 0.5)")
    addg("--seed", type=int, default=0, help="sampling seed (default 0)")
    addg("--top-k", type=int, default=None, help="top-k per head (default 50)")
    addg("--temperature", type=float, default=None, help="softmax temperature (default 0.7)")
    addg("--repetition-penalty", type=float, default=None, help="divides the probability of repeated tokens (default 1.1)")
    addg("--alpha-c", type=float, default=1.0, help="co-occurrence mask exponent α_c (default 1.0)")
    addg("--unseen-weight", type=float, default=0.5, help="co-occurrence mask of pairs/triples the corpus lacks (default 0.5; 0 = hard)")
    addg("--max-n", type=int, default=None, help="most tokens per call (default: the model's heads, at most 3)")
    addg("--no-cooccurrence", action="store_true", help="turn co-occurrence masking off")
    addg("--no-adaptive-threshold", action="store_true", help="turn Otsu adaptive thresholding off")
    addg("--no-blur", action="store_true", help="no Gaussian blur before Otsu")
    addg("--variant", choices=["CO+AT+G3", "CO+AT", "CO", "CO-0.5+AT+G3", "AT+G3"],
         help="an ablation variant (sets the three technique flags and α_c)")
    addg("--cooccurrence", default="auto", metavar="PATH",
         help="co-occurrence table (file or LM build dir); auto: the bundled build's or one counted on stdlib:train")
    add("--tokenizer", default=None, metavar="PATH", help="tokenizer (default: beside the model, else data/tokenizer)")
    add("--device", default=None, help="torch device (default cpu)")


def _sampling_args(p: argparse.ArgumentParser) -> None:
    """generate's sampling flags, its meanings and defaults (``--method bpd`` and ``lookahead``
    with ``--do-sample``; ``--method mtad`` always samples, default top-k 20 / top-p 0.9)."""
    g = p.add_argument_group("sampling (--do-sample: as generate(do_sample=True), same meanings and defaults)")
    g.add_argument("--do-sample", action="store_true",
                   help="sample instead of decoding greedily; --method bpd and lookahead sample losslessly "
                        "(speculative sampling: the output has the target's sampling distribution)")
    g.add_argument("--temperature", type=float, default=None, help="softmax temperature (default 1.0; dynamo 0.7)")
    g.add_argument("--top-k", type=int, default=None, help="keep the K most likely tokens, 0 = off (default 50; mtad 20)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus filter, 1 = off (default 1.0; mtad 0.9)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed; row r draws from default_rng([S, r]) (default 0)")
    g.add_argument("--repetition-penalty", type=float, default=None,
                   help="generate's repetition penalty, 1 = off (default 1.0; dynamo 1.1)")


def _sampling(a):
    """``SamplingOptions`` of ``--do-sample`` (and of ``--method mtad``, which always samples);
    None: greedy."""
    method = getattr(a, "method", None)
    if not (getattr(a, "do_sample", False) or method == "mtad"):
        return None
    from latticedraft.decoding.spec_sampling import SamplingOptions

    mtad = method == "mtad"
    pick = lambda v, default: default if v is None else v  # noqa: E731
    return SamplingOptions(temperature=pick(a.temperature, 1.0), top_k=pick(a.top_k, 20 if mtad else 50),
                           top_p=pick(a.top_p, 0.9 if mtad else 1.0), seed=a.seed,
                           repetition_penalty=pick(a.repetition_penalty, 1.0))


def _mtad_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("auxiliary draft model (--drafter model, --method mtad)")
    g.add_argument("--draft-model", default=None, metavar="DIR",
                   help="a small causal LM with the target's tokenizer that drafts (e.g. data/rescorer-medium)")
    g.add_argument("--beams", type=int, default=8, help="MTAD: beams of the draft model's beam sampling (default 8)")
    g.add_argument("--tau", type=float, default=0.1,
                   help="MTAD: accept the longest draft prefix whose joint ratio min(1, p/q) exceeds TAU "
                        "(default 0.1; >= 1: ordinary sampling). MTAD is approximate, not lossless")


def _gamma_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gamma", type=int, default=None,
                   help="most tokens drafted per step: by the draft model (--drafter model, --method mtad; default "
                        "4) or by Kangaroo's adapter (--method kangaroo; default 6)")


def gamma_of(a, default: int) -> int:
    """``--gamma``, or the method's default when it was left out."""
    return default if getattr(a, "gamma", None) is None else a.gamma


def _mtad(a):
    if getattr(a, "method", None) != "mtad":
        return None
    from latticedraft.decoding.mtad import MtadOptions

    return MtadOptions(gamma=gamma_of(a, 4), beams=a.beams, tau=a.tau)


def _dynamo_config(a):
    from latticedraft.decoding.dynamo import DynamoConfig, variant

    cfg = DynamoConfig(epsilon_b=a.epsilon_b, top_k=50 if a.top_k is None else a.top_k,
                       temperature=0.7 if a.temperature is None else a.temperature,
                       repetition_penalty=1.1 if a.repetition_penalty is None else a.repetition_penalty,
                       cooccurrence=not a.no_cooccurrence, alpha_c=a.alpha_c,
                       unseen_weight=a.unseen_weight, adaptive_threshold=not a.no_adaptive_threshold,
                       blur=not a.no_blur, max_n=a.max_n)
    if getattr(a, "variant", None):
        cfg = variant(a.variant, a.epsilon_b, cfg)
    cfg.validate()
    return cfg


def _prompt_texts(a) -> list[str]:
    """The prompts of ``--prompt TEXT`` (``-``: standard input) or ``--prompts FILE.jsonl`` (``-`` too)."""
    from latticedraft.decoding.run import read_prompts
    from latticedraft.errors import InputError
    from latticedraft.textin import check_text_value, read_text_arg

    if (a.prompt is None) == (a.prompts is None):
        raise InputError("give exactly one of --prompt TEXT or --prompts FILE.jsonl (- reads standard input)")
    if a.prompt == "-":
        return [read_text_arg("-", "--prompt", "pipe UTF-8 text into --prompt -")]
    texts = [a.prompt] if a.prompt is not None else [r["prompt"] for r in read_prompts(a.prompts)]
    for i, t in enumerate(texts, 1):
        check_text_value(t, "--prompt" if a.prompt is not None else f"--prompts record {i}")
    return texts


def _set_threads(a) -> None:
    """Apply ``--threads`` where no ``Session`` does it (the DynaMo commands)."""
    if getattr(a, "threads", None) is not None:
        import torch

        torch.set_num_threads(a.threads)


def _cmd_decode_dynamo(a, texts: list[str]) -> int:
    """``decode --method dynamo``: sample with the DynaMo heads; prints text, tokens per call and n per step."""
    import json

    from latticedraft.cli_checks import check_model_limits
    from latticedraft.decoding.dynamo import decode_texts, load_model, load_tokenizer_for
    from latticedraft.decoding.prompt_length import fit_prompts
    from latticedraft.lm.cooccurrence import resolve_table

    cfg = _dynamo_config(a)
    _set_threads(a)
    model_dir = getattr(a, "model", None)
    model = load_model(model_dir, device=getattr(a, "device", None))
    check_model_limits(a, model)
    tok = load_tokenizer_for(model, model_dir, getattr(a, "tokenizer", None))
    max_new = getattr(a, "max_new_tokens", 64) or 64
    fit_prompts(model, [tok.encode(t, add_special_tokens=False).ids for t in texts], max_new, a.truncate_left)
    cooc = None
    if cfg.cooccurrence and cfg.alpha_c > 0:
        cooc = resolve_table(a.cooccurrence, tok, notify=lambda m: print(m, file=sys.stderr))
    for i, text in enumerate(texts):  # one prompt at a time: each record is out before the next prompt starts
        r = decode_texts(model, tok, [text], cfg, cooc, max_new_tokens=max_new, seed=a.seed,
                         eos_token_id=tok.token_to_id("<|endoftext|>"), first_row=i, truncate_left=a.truncate_left)[0]
        r["model"] = str(getattr(model, "base_ref", None) or "")
        r["method"] = "dynamo"
        if getattr(a, "json", False):
            print(json.dumps(r, ensure_ascii=False), flush=True)
        else:
            print(text + r["text"], flush=True)
            print(f"-- {len(r['tokens'])} tokens in {r['calls']} calls: {r['tokens_per_call']:.2f} tokens/call; "
                  f"n per call: {' '.join(map(str, r['ns']))}", file=sys.stderr)
    return 0


def _dynamo_eval_args(p: argparse.ArgumentParser) -> None:
    """Flags of ``eval --method dynamo`` (the ablation); options the parser already has are left to it."""
    _dynamo_sampler_args(p)
    have = set(p._option_string_actions)
    g = p.add_argument_group("DynaMo ablation (--method dynamo)")
    for flag, kw in [
        ("--epsilons", dict(type=float, nargs="+", default=None, help="ε_b grid (default 0.0 0.1 … 1.0)")),
        ("--variants", dict(nargs="+", default=None, help="variants (default CO+AT+G3 CO+AT CO CO-0.5+AT+G3 AT+G3)")),
        ("--seeds", dict(type=int, nargs="+", default=[0], help="sampling seeds per prompt (default 0)")),
        ("--num-prompts", dict(type=int, default=20, help="first N prompts of the file (default 20)")),
        ("--heldout-tokens", dict(type=int, default=16384, help="held-out tokens for PPL_n / PPL_1:n (0: skip)")),
        ("--dynamic-tokens", dict(type=int, default=2048, help="held-out tokens for PPL_d per ε_b (default 2048)")),
        ("--out", dict(type=Path, default=Path("dynamo-eval"), help="output directory (default ./dynamo-eval)")),
        ("--max-new-tokens", dict(type=int, default=48, help="tokens per generation (default 48)")),
        ("--prompts", dict(default=None, help="prompt JSONL (default data/prompts.jsonl)")),
        ("--model", dict(default=None, help="DynaMo head checkpoint (default data/heads-dynamo)")),
    ]:
        if flag not in have:
            g.add_argument(flag, **kw)


def _cmd_eval_dynamo(a) -> int:
    """``eval --method dynamo``: ε_b × variants ablation, quality proxy, held-out perplexities; table + PNG."""
    from latticedraft.decoding.dynamo import VARIANTS
    from latticedraft.decoding.dynamo_eval import EPSILONS, evaluate

    _set_threads(a)
    res, paths = evaluate(
        model_dir=getattr(a, "model", None), prompts_file=getattr(a, "prompts", None), out_dir=a.out,
        tokenizer_path=getattr(a, "tokenizer", None), cooccurrence=a.cooccurrence, num_prompts=a.num_prompts,
        seeds=a.seeds, max_new_tokens=getattr(a, "max_new_tokens", 48) or 48, epsilons=a.epsilons or EPSILONS,
        variants=a.variants or VARIANTS, heldout_tokens=a.heldout_tokens, dynamic_tokens=a.dynamic_tokens,
        base=_dynamo_config(a), device=getattr(a, "device", None), notify=lambda m: print(m, file=sys.stderr))
    print(paths["table"].read_text())
    print(f"wrote {paths['json']}, {paths['table']}, {paths['plot']}")
    return 0


# -- decode / eval / tune / demo (parallel BPD) -------------------------------------------------


def _drafter_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("drafting (--method bpd)")
    g.add_argument("--drafter", default="top1",
                   choices=["top1", "neural", "ngram", "parallel", "parallel-base", "oracle", "model", "none"],
                   help="top1 = vanilla BPD; ngram/parallel = n-gram rescoring, p = 1 / --nbest; "
                        "parallel-base = --nbest paths of the un-rescored lattice; neural = Algorithm 2; "
                        "oracle = best lattice path given the greedy output; model = an auxiliary draft model "
                        "(--draft-model DIR, classic speculative decoding); none = no head drafts (with "
                        "--context-ngrams: prompt lookup on latticedraft's verifier) (default top1)")
    g.add_argument("--lm", default=None, metavar="DIR", help="n-gram LM build (default: the bundled 4-gram)")
    g.add_argument("--rescorer", default=None, metavar="DIR", help="neural rescorer (default data/rescorer-small)")
    g.add_argument("--alpha", type=float, default=1.0, help="interpolation weight of the rescoring LM (default 1.0)")
    g.add_argument("--nbest", type=int, default=16, help="drafts verified per step for parallel drafters (default 16)")
    g.add_argument("--k", type=int, default=16, help="candidates per head in the lattice (default 16)")
    g.add_argument("--prune", default="none", choices=["none", "static", "otsu"], help="lattice pruning (default none)")
    g.add_argument("--eps", type=float, default=0.001, help="static pruning threshold, a probability (default 0.001)")
    g.add_argument("--backoff", type=float, default=None, metavar="EPS_B",
                   help="cut the lattice at the first head whose best probability is below EPS_B")
    g.add_argument("--slots", type=int, default=None, metavar="D",
                   help="draft from the first D extra heads only; the others are not computed (default: all)")
    g.add_argument("--verify", default="auto", choices=["auto", "tree", "batched"],
                   help="tree attention or drafts as batch rows (default auto: tree where the model takes 4-D masks)")


def _tree_args(p: argparse.ArgumentParser) -> None:
    """Which nodes each step verifies (decode only: eval and tune measure the paper's drafters)."""
    g = p.add_argument_group("draft tree (--method bpd)")
    g.add_argument("--tree", default="auto", choices=["auto", "fixed"],
                   help="auto: verify the nodes that maximise expected tokens per second under the measured "
                        "step cost T(n); fixed: every drafted path (default auto)")
    g.add_argument("--context-ngrams", type=int, default=3, metavar="N",
                   help="also draft what followed earlier matches of the last N..1 tokens in the prompt and "
                        "output (prompt lookup); 0 = off (default 3)")
    g.add_argument("--draft-vocab", default="auto", metavar="V",
                   help="the extra heads project onto the V most frequent tokens (draft_vocab.json beside the "
                        "heads); 0 = the full vocabulary; verification always uses all (default auto: 1024 "
                        "where the heads ship a ranking, else all)")
    g.add_argument("--lookahead-pool", action="store_true",
                   help="also run a lookahead Jacobi window in each verify call and add its n-gram pool's "
                        "paths for the last token to the tree (sizes from --window/--ngram/--pool)")


def _lookahead_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("lookahead decoding (--method lookahead)")
    g.add_argument("--window", type=int, default=15, metavar="W",
                   help="W: future positions the Jacobi window guesses per step (default 15, the paper's for 7B)")
    g.add_argument("--ngram", type=int, default=5, metavar="N",
                   help="N: n-gram size; the window keeps N-1 past Jacobi iterates (default 5)")
    g.add_argument("--pool", type=int, default=15, metavar="G",
                   help="G: n-grams kept per first token and verified per step; 0 = Jacobi window only (default 15)")
    g.add_argument("--prompt-as-reference", action="store_true",
                   help="start the window from prompt tokens and seed the n-gram pool with the prompt's n-grams")
    g.add_argument("--lookahead-config", default=None, metavar="FILE.json",
                   help="W, N, G (and --prompt-as-reference) chosen by `latticedraft tune --method lookahead`")


def _self_draft_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("early-layer self-drafting (--method kangaroo / ppd)")
    g.add_argument("--adapter", default=None, metavar="DIR",
                   help="kangaroo: the adapter from `train adapter` (default data/adapter-kangaroo; its exit layer is l)")
    g.add_argument("--eta", type=float, default=0.6,
                   help="kangaroo: stop drafting when the adapter's top-1 probability is <= eta (default 0.6)")
    g.add_argument("--exit-layer", type=int, default=None, metavar="DBAR",
                   help="ppd: early prediction after this layer (default: half the layers)")
    g.add_argument("--candidates", type=int, default=3, metavar="K",
                   help="ppd: early top-k candidates started per token (default 3)")
    g.add_argument("--exit-heads", default=None, metavar="DIR",
                   help="ppd: per-layer early-exit heads from `train heads --early-exit` (default: the shared LM head)")


def _self_draft(a):
    """``KangarooOptions`` / ``PPDOptions`` of ``--method kangaroo`` / ``ppd`` (None otherwise)."""
    if getattr(a, "method", None) == "kangaroo":
        from latticedraft.decoding.kangaroo import KangarooOptions

        return KangarooOptions(gamma=gamma_of(a, 6), eta=a.eta, adapter=a.adapter)
    if getattr(a, "method", None) == "ppd":
        from latticedraft.decoding.ppd import PPDOptions

        return PPDOptions(dbar=a.exit_layer, k=a.candidates, exit_heads=a.exit_heads)
    return None


def _self_draft_rows(a):
    """(KangarooOptions, PPDOptions) of eval's Kangaroo and PPD rows."""
    from latticedraft.cli_checks import check_self_draft
    from latticedraft.decoding.kangaroo import KangarooOptions
    from latticedraft.decoding.ppd import PPDOptions

    # ranges only: eval runs both rows, so neither method's options are refused
    check_self_draft(argparse.Namespace(**{**{k: v for k, v in vars(a).items() if not k.startswith("_")},
                                           "method": None}))
    return (KangarooOptions(gamma=gamma_of(a, 6), eta=a.eta, adapter=a.adapter),
            PPDOptions(dbar=a.exit_layer, k=a.candidates, exit_heads=a.exit_heads))


def _lookahead(a):
    from latticedraft.decoding.lookahead import LookaheadOptions

    if getattr(a, "lookahead_config", None):
        from latticedraft.decoding.tune_lookahead import read_lookahead_config

        return LookaheadOptions(**read_lookahead_config(a.lookahead_config))
    return LookaheadOptions(W=a.window, N=a.ngram, G=a.pool, prompt_as_reference=a.prompt_as_reference)


def _spec(a):
    from latticedraft.decoding.run import DrafterSpec
    from latticedraft.errors import InputError

    tree = dict(tree=getattr(a, "tree", "fixed"), context_ngrams=getattr(a, "context_ngrams", 0))
    vocab = getattr(a, "draft_vocab", None)
    if vocab not in (None, "auto"):
        try:
            vocab = int(vocab)
        except ValueError:
            raise InputError(f"--draft-vocab {vocab!r}: give a number of tokens (0 = full vocabulary) or auto") from None
        if vocab < 0:
            raise InputError(f"--draft-vocab {vocab}: give a number of tokens >= 1, 0 for the full vocabulary, or auto")
        vocab = vocab or None
    if tree["context_ngrams"] < 0:
        raise InputError(f"--context-ngrams {tree['context_ngrams']}: give the longest suffix to match (>= 1), or 0 for off")
    look = _lookahead(a) if getattr(a, "lookahead_pool", False) else None
    return DrafterSpec(name=a.drafter, k=a.k, prune=a.prune, eps=a.eps, backoff=a.backoff, slots=a.slots,
                       alpha=a.alpha, nbest=a.nbest, draft_vocab=vocab, lookahead=look,
                       gamma=gamma_of(a, 4), **tree)


def _cmd_decode(a) -> int:
    """``decode``: stream the continuation of each prompt, or one JSON object per prompt."""
    import json

    from latticedraft.cli_checks import check_decode, check_model_limits
    from latticedraft.decoding.prompt_length import fit_prompts
    from latticedraft.decoding.run import Session, TextStream, encode, records

    check_decode(a)
    if a.output is not None:
        return _cmd_decode_dataset(a)
    texts = _prompt_texts(a)
    if a.method == "dynamo":
        return _cmd_decode_dynamo(a, texts)
    spec = _spec(a)
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads, getattr(a, "draft_model", None))
    s.notify = lambda m: print(m, file=sys.stderr)
    check_model_limits(a, s.model)
    ids = fit_prompts(s.model, encode(s.tokenizer, texts), a.max_new_tokens, a.truncate_left)
    look = _lookahead(a) if a.method == "lookahead" else None
    smp, mtad, sd = _sampling(a), _mtad(a), _self_draft(a)
    if a.method == "bpd":
        s.prepare(spec if smp is None else spec.for_sampling(), batch_size=a.batch_size if a.json else 1)
    if a.method == "mtad":
        _ = s.draft_model  # a missing or mismatched draft model fails before any output
    if sd is not None:
        s.self_draft(a.method, sd)  # a missing or mismatching adapter fails before any output
    how = "" if smp is None else (f" sampling T={smp.temperature} top-k={smp.top_k} top-p={smp.top_p} seed={smp.seed}"
                                  + ("" if smp.repetition_penalty == 1.0 else f" rep={smp.repetition_penalty}"))
    label = {"bpd": f"bpd/{a.drafter}" + how,
             "lookahead": None if look is None else f"lookahead W={look.W} N={look.N} G={look.G}" + how,
             "mtad": None if mtad is None else f"mtad gamma={mtad.gamma} beams={mtad.beams} tau={mtad.tau} (approximate)"
                                               + how,
             "kangaroo": a.method == "kangaroo" and f"kangaroo gamma={sd.gamma} eta={sd.eta}",
             "ppd": a.method == "ppd" and f"ppd exit-layer={sd.dbar or 'd/2'} k={sd.k}"}.get(a.method, a.method)
    if a.json:  # each batch's records are written and flushed as soon as it completes
        for at in range(0, len(ids), a.batch_size):
            res = s.decode(ids[at:at + a.batch_size], a.method, spec, max_new_tokens=a.max_new_tokens,
                           verify=a.verify, batch_size=a.batch_size, lookahead=look, sampling=smp, first_row=at,
                           mtad=mtad, self_draft=sd)
            for rec in records(res, s.tokenizer, s.base_dir, texts[at:at + a.batch_size]):
                print(json.dumps({**rec, "method": label}, ensure_ascii=False), flush=True)
        return 0
    for row, (text, p) in enumerate(zip(texts, ids)):
        sys.stdout.write(text)
        res = s.decode([p], a.method, spec, max_new_tokens=a.max_new_tokens, verify=a.verify,
                       on_tokens=TextStream(s.tokenizer, sys.stdout), lookahead=look, sampling=smp, first_row=row,
                       mtad=mtad, self_draft=sd)
        q = res.sequences[0]
        print()
        print(f"-- {len(q.tokens)} tokens, {q.calls} calls, block efficiency {q.block_efficiency:.2f}, "
              f"{len(q.tokens) / max(q.seconds, 1e-9):.1f} tokens/s ({label}, verify {res.verify_mode})",
              file=sys.stderr)
    return 0


def _cmd_decode_dataset(a) -> int:
    """``decode --prompts IN --output OUT``: resumable record file, sharded under torchrun."""
    from pathlib import Path

    from latticedraft.cli_checks import check_model_limits
    from latticedraft.decoding import dataset_run as dr
    from latticedraft.decoding import shards
    from latticedraft.decoding.prompt_set import read_prompt_set, summarize_bad
    from latticedraft.decoding.run import Session, default_model_dir, default_rescorer_dir
    from latticedraft.paths import default_lm_dir

    world = shards.world_from_env()
    if world.distributed and a.prompts == "-":
        from latticedraft.errors import InputError

        raise InputError("--prompts - under a launcher: every rank reads the prompt set; give --prompts FILE.jsonl")
    spec = _spec(a) if a.method == "bpd" else None
    prompts, bad = read_prompt_set(a.prompts, a.skip_bad)
    resolved = lambda p, default: str(Path(p if p is not None else default).resolve())  # noqa: E731
    settings = dr.run_settings(
        method=a.method, model=resolved(a.model, default_model_dir()),
        tokenizer=None if a.tokenizer is None else resolved(a.tokenizer, None), max_new_tokens=a.max_new_tokens,
        verify=a.verify, spec=spec, lm=resolved(a.lm, default_lm_dir()),
        rescorer=resolved(a.rescorer, default_rescorer_dir()))
    plan = dr.plan_output(a.output, world, settings, a.resume)
    loud = world.rank == 0 or not a.quiet_ranks
    if bad and world.rank == 0:
        print(summarize_bad(bad), file=sys.stderr)
    for path in plan.torn if loud else []:
        print(f"{path}: the last line is torn (a run was killed while writing it); that prompt is decoded again",
              file=sys.stderr)
    device = shards.device_for(world, a.device)
    shards.init(world, device)  # returns once every rank has joined, so after every rank's plan_output
    try:
        s = Session(a.model, a.tokenizer, a.lm, a.rescorer, device, a.threads)
        check_model_limits(a, s.model)
        if a.method == "bpd":
            s.prepare(spec, batch_size=a.batch_size)
        summary = dr.decode_shard(s, plan, prompts, method=a.method, spec=spec, max_new_tokens=a.max_new_tokens,
                                  verify=a.verify, batch_size=a.batch_size, sort_by_length=a.sort_by_length,
                                  quiet_ranks=a.quiet_ranks)
        if loud:
            print(summary.line(world), file=sys.stderr)
        merged = dr.finish_output(plan, prompts, device)
    finally:
        shards.finish(world)
    if merged is not None:
        n, extra = merged
        note = f", {len(extra)} of them for prompt ids not in --prompts (kept at the end)" if extra else ""
        print(f"wrote {a.output}: {n} records in prompt order{note}", file=sys.stderr)
    return 0


def _common_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="DIR", help="BPD head checkpoint or HF causal LM (default data/heads-stern)")
    p.add_argument("--tokenizer", default=None, metavar="PATH", help="tokenizer.json (default: beside the model, else data/tokenizer)")
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest for tiny models on a busy CPU)")


def _add_decode(groups) -> None:
    p = groups.add_parser("decode", help="generate with parallel BPD (exactly the greedy output, fewer model calls)",
                          description="Generate with blockwise parallel decoding; the output equals greedy decoding.")
    p.add_argument("--method", default="bpd", choices=["bpd", "greedy", "lookahead", "mtad", "kangaroo", "ppd", "dynamo"],
                   help="bpd (default), greedy (plain autoregressive baseline), lookahead (lookahead decoding: "
                        "Jacobi window + n-gram pool, no heads needed), mtad (multi-token assisted decoding with "
                        "--draft-model: APPROXIMATE sampling, not lossless), kangaroo (drafts from the first l layers "
                        "+ an adapter), ppd (predictive pipelined decoding from an early exit) or dynamo (sampling "
                        "with DynaMo heads, approximate)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="prompt text; - reads it from standard input (default: --prompts)")
    src.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                     help="one {\"prompt\": ...} per line; - reads standard input (default: --prompt)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--truncate-left", type=int, default=None, metavar="N",
                   help="keep the last N tokens of each prompt (prompt + --max-new-tokens must fit the model's "
                        "positions; default: refuse a prompt that does not)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together; needs --json or --output (default 1)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per prompt, each as soon as its batch completes, "
                        "instead of streaming text")
    d = p.add_argument_group("data sets (--prompts IN.jsonl --output OUT.jsonl; sharded when run under torchrun)")
    d.add_argument("-o", "--output", default=None, metavar="OUT.jsonl",
                   help="append one JSON record per prompt (with its id and the settings fingerprint) as each "
                        "batch completes, then order them as the prompts; - writes standard output")
    d.add_argument("--resume", action="store_true",
                   help="skip prompts that already have a complete record in OUT (same settings required); "
                        "a torn last line is decoded again")
    d.add_argument("--skip-bad", action="store_true",
                   help="leave out malformed lines, empty prompts and duplicate ids (counted on stderr) instead "
                        "of refusing the file")
    d.add_argument("--sort-by-length", action="store_true",
                   help="batch prompts of similar token length together; OUT still follows the input order")
    d.add_argument("--quiet-ranks", action="store_true",
                   help="under torchrun, only rank 0 shows a progress bar and a summary")
    _common_model_args(p)
    _drafter_args(p)
    _tree_args(p)
    _mtad_args(p)
    _lookahead_args(p)
    _self_draft_args(p)
    _gamma_arg(p)
    _sampling_args(p)
    _dynamo_sampler_args(p)
    p.set_defaults(func=_cmd_decode)


def _ids(values, opt: str = "token ids") -> list[int] | None:
    """Token ids as typed after ``opt``, one spelling everywhere: ``12,7,99``, ``12 7 99`` or
    ``"12 7 99"`` (``values`` is argparse's list of words, or one string) -> [12, 7, 99]; None stays None."""
    if values is None:
        return None
    text = " ".join(values) if isinstance(values, (list, tuple)) else str(values)
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        from latticedraft.errors import InputError

        raise InputError(f"{opt} {text!r}: token ids must be integers separated by commas or spaces, "
                         "e.g. 12,7,99 or 12 7 99") from None


def _add_ids(p, flag: str, help: str, default=None) -> None:
    """An option taking token ids, space- or comma-separated (see ``_ids``)."""
    p.add_argument(flag, nargs="*", default=default, metavar="ID", help=help + "; space- or comma-separated")


def _cmd_rescore(a) -> int:
    import json

    from latticedraft.lattice.rescoring import rescore_file

    res = rescore_file(a.lattice, a.lm, alpha=a.alpha, nbest=a.nbest, history=_ids(a.history, "--history"),
                       method=a.method)
    if res["truncated"]:
        print(f"note: the lattice has only {len(res['paths'])} paths; returning all of them", file=sys.stderr)
    print(json.dumps(res))
    return 0


def _add_rescore(groups) -> None:
    p = groups.add_parser("rescore", help="the p best drafts of a lattice under head + alpha * n-gram scores (JSON)",
                          description="Rescore a sausage lattice (.npz from Sausage.save) with an n-gram LM and "
                                      "print the p best distinct paths as JSON.")
    p.add_argument("--lm", required=True, metavar="DIR", help="n-gram build directory (latticedraft lm build)")
    p.add_argument("--lattice", required=True, metavar="FILE.npz", help="lattice written by Sausage.save")
    p.add_argument("--alpha", type=float, default=1.0, help="LM weight: score = head_logp + alpha * lm_logp (default 1)")
    p.add_argument("--nbest", type=int, default=1, help="number of distinct drafts (default 1)")
    _add_ids(p, "--history", "emitted token ids before the lattice, e.g. 12,7,99 (default: the file's 'history', "
                             "else <s>)")
    p.add_argument("--method", default="exact", choices=["exact", "wfst"],
                   help="exact (back-off semantics, default) or wfst (OpenFST compose + n-shortest, epsilon back-off)")
    p.set_defaults(func=_cmd_rescore)


def _cmd_lattice_draw(a) -> int:
    from latticedraft.lattice.draw import draw_file

    from latticedraft.paths import check_writable

    check_writable(a.out, "--out", "file")
    out = draw_file(a.lattice, a.out, tokenizer=a.tokenizer, reference=_ids(a.reference, "--reference"), lm=a.lm,
                    alpha=a.alpha, history=_ids(a.history, "--history"))
    print(out)
    return 0


def _add_lattice(groups) -> None:
    p = groups.add_parser("lattice", help="inspect sausage lattices",
                          description="Inspect sausage lattices saved with Sausage.save.")
    sub = p.add_subparsers(dest="verb", required=True, metavar="<verb>")
    d = sub.add_parser("draw", help="draw a lattice like Figure 4 of the BPD paper (PNG)",
                       description="Draw a lattice: one column per slot, arcs by weight with token text and score; "
                                   "the chosen path in blue, the reference in green.")
    d.add_argument("lattice", metavar="LATTICE.npz", help="lattice written by Sausage.save")
    d.add_argument("-o", "--out", required=True, metavar="OUT.png", help="output file: the PNG picture to write")
    d.add_argument("--tokenizer", default=None, metavar="PATH", help="tokenizer.json for token text (default: ids)")
    _add_ids(d, "--reference", "the target's tokens (default: the file's 'reference')")
    d.add_argument("--lm", default=None, metavar="DIR", help="choose the path by rescoring with this n-gram (default: "
                                                             "the file's 'chosen', else top-1)")
    d.add_argument("--alpha", type=float, default=1.0, help="LM weight with --lm (default 1)")
    _add_ids(d, "--history", "history for --lm (default: the file's 'history')")
    d.set_defaults(func=_cmd_lattice_draw)


def _cmd_eval(a) -> int:
    """``eval``: every drafter on a prompt set; results.json, results.md, Figure 6 and 7 PNGs."""
    from latticedraft.cli_checks import (DRAFTING, DYNAMO_ONLY, LOOKAHEAD, at_least, check_device,
                                         check_drafting, check_lookahead_sizes, check_model_limits, check_sampling,
                                         refuse_given)
    from latticedraft.paths import check_writable

    if a.records is not None:
        return _cmd_eval_records(a)
    check_device(a.device)
    at_least(a, "truncate_left", 1)
    check_drafting(a)
    check_writable(a.out, "--out", "directory")
    if a.method == "dynamo":
        refuse_given(a, DRAFTING + LOOKAHEAD + ("alphas", "lm2", "rescorers", "batch_size", "skip", "do_sample", "top_p",
                                                "truncate_left"),
                     "eval --method dynamo runs the DynaMo ablation (those options apply to --method bpd)")
        return _cmd_eval_dynamo(a)
    refuse_given(a, DYNAMO_ONLY + ("epsilons", "variants", "seeds", "heldout_tokens", "dynamic_tokens"),
                 "the DynaMo ablation options apply to --method dynamo (eval --method bpd samples with --do-sample)")
    check_sampling(a, "bpd")
    from latticedraft.decoding.evaluate import EvalConfig, evaluate
    from latticedraft.decoding.run import Session, read_prompts
    from latticedraft.decoding.tune import read_alphas
    from latticedraft.errors import InputError
    from latticedraft.paths import data_dir

    for flag, value, default in (("--drafter", a.drafter, "top1"), ("--slots", a.slots, None)):
        if value != default:
            raise InputError(f"{flag} {value}: eval runs every drafter (and Table 10's head counts) itself; "
                             f"drop {flag}, or use `latticedraft decode` for one drafter")
    check_lookahead_sizes(a)
    alphas = read_alphas(a.alphas) if a.alphas else {"ngram": a.alpha, "neural": a.alpha}
    rescorers = {}
    for spec in a.rescorers or []:
        label, _, path = spec.partition("=")
        rescorers[f"neural-{label}" if path else "neural"] = path or label
    cfg = EvalConfig(num_prompts=a.num_prompts, skip=a.skip, max_new_tokens=a.max_new_tokens, k=a.k, nbest=a.nbest,
                     prune=a.prune, eps=a.eps, backoff=a.backoff, verify=a.verify,
                     alphas=alphas, batch_size=a.batch_size, lm2=a.lm2, rescorers=rescorers,
                     lookahead=_lookahead(a), kangaroo=_self_draft_rows(a)[0], ppd=_self_draft_rows(a)[1],
                     sampling=_sampling(a), truncate_left=a.truncate_left)
    prompts = read_prompts(a.prompts or data_dir() / "prompts.jsonl")
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads)
    s.notify = lambda m: print(m, file=sys.stderr)
    check_model_limits(a, s.model)
    paths = evaluate(s, prompts, cfg, a.out, notify=lambda m: print(m, file=sys.stderr))
    print(paths["table"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _cmd_eval_records(a) -> int:
    """``eval --records OUT.jsonl``: a ``decode --output`` run per rank and in total."""
    from latticedraft.cli_checks import given, refuse_given
    from latticedraft.decoding import rank_summary
    from latticedraft.paths import check_writable

    refuse_given(a, [d for d in a._defaults if d not in ("records", "out")],
                 "eval --records summarizes a finished decode --output run (only --out applies)")
    if given(a, "out"):
        check_writable(a.out, "--out", "directory")
    summary = rank_summary.summarize(rank_summary.read_records(a.records))
    print(rank_summary.table(summary))
    if given(a, "out"):
        paths = rank_summary.write(summary, a.out)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _add_eval(groups) -> None:
    p = groups.add_parser("eval", help="every drafter on a prompt set: the paper's Tables 4, 3, 10 and Figures 6, 7",
                          description="Block efficiency of every drafter (and exactness against greedy) on a prompt set.")
    p.add_argument("--method", default="bpd", choices=["bpd", "dynamo"], help="bpd (default) or the DynaMo ablation")
    p.add_argument("--records", default=None, metavar="OUT.jsonl",
                   help="instead: summarize a `decode --output` run, per rank and in total (block efficiency, "
                        "tokens/s); writes records.json and records.md only with an explicit --out")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl", help="{\"prompt\", \"reference\"?} per line (default data/prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, default=20, help="prompts evaluated (default 20)")
    p.add_argument("--skip", type=int, default=0, help="skip the first N prompts (the tuning split of `tune`)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default 64)")
    p.add_argument("--truncate-left", type=int, default=None, metavar="N",
                   help="keep the last N tokens of each prompt (default: refuse a prompt that does not fit)")
    p.add_argument("--batch-size", type=int, default=4, help="prompts decoded together (default 4)")
    p.add_argument("--alphas", default=None, metavar="tuned.json", help="alphas from `latticedraft tune` (else --alpha for all)")
    p.add_argument("--lm2", default=None, metavar="DIR", help="2-gram build for Table 3 (default: the --lm model)")
    p.add_argument("--rescorers", nargs="+", default=None, metavar="LABEL=DIR",
                   help="neural rescorers, one Table 4 column each (default: --rescorer)")
    p.add_argument("-o", "--out", type=Path, default=Path("out/eval"),
                   help="output directory for results.json, results.md and the figures (default ./out/eval)")
    _common_model_args(p)
    _drafter_args(p)
    _lookahead_args(p)
    _self_draft_args(p)
    _gamma_arg(p)
    _sampling_args(p)
    _dynamo_eval_args(p)
    p.set_defaults(func=_cmd_eval)


def _cmd_tune(a) -> int:
    import math

    from latticedraft.cli_checks import check_device, check_drafting, check_model_limits, refuse_given
    from latticedraft.decoding.run import Session, read_prompts
    from latticedraft.decoding.tune import GRID, tune
    from latticedraft.errors import InputError
    from latticedraft.paths import check_writable, data_dir

    check_device(a.device)
    check_drafting(a)
    if a.out is None:
        a.out = Path("tuned-lookahead.json" if a.method == "lookahead" else "tuned.json")
    check_writable(a.out, "--out", "file")
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
    from latticedraft.cli_checks import refuse_given
    from latticedraft.decoding.run import Session, read_prompts
    from latticedraft.decoding.tune_lookahead import NGRAMS, POOLS, WINDOWS, check_grid, tune_lookahead
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


def _add_tune(groups) -> None:
    p = groups.add_parser("tune", help="sweep alpha (Appendix E), or lookahead's (W, N, G), on a held-out split",
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
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="output file (default ./tuned.json; ./tuned-lookahead.json with --method lookahead)")
    _common_model_args(p)
    p.set_defaults(func=_cmd_tune)


def _cmd_demo(a) -> int:
    from latticedraft.decoding.demo import run_demo, table
    from latticedraft.decoding.run import Session
    from latticedraft.cli_checks import check_device, check_drafting
    from latticedraft.decoding.tune import default_alphas_file, read_alphas
    from latticedraft.paths import check_writable

    check_device(a.device)
    check_drafting(a)
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


def _add_demo(groups) -> None:
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
    _common_model_args(p)
    p.set_defaults(threads=1)
    p.set_defaults(func=_cmd_demo)


_GROUPS: list = []
_GROUPS.append(_add_train)
_GROUPS.append(_add_lm)
_GROUPS.append(_add_decode)
_GROUPS.append(_add_eval)
_GROUPS.append(_add_tune)
_GROUPS.append(_add_demo)
_GROUPS.append(_add_rescore)
_GROUPS.append(_add_lattice)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from latticedraft.textin import check_text_value

        for dest in ("prompt", "text"):
            check_text_value(getattr(args, dest, None), f"--{dest}")
        return int(args.func(args) or 0)
    except LatticedraftError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except OSError as e:  # the file system refused: a path the user gave, named by the OS
        where = f" {e.filename}" if e.filename else ""
        print(f"error:{where}: {e.strerror or e}; check the path and its permissions", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
