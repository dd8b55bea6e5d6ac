"""``latticedraft decode``: generate with any registered method (``decoding/registry.py``), as
streamed text, one JSON object per prompt (``--json``), or a resumable data-set run (``--output``).
Which options apply to which method comes from the registry."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from latticedraft.cli.args import (common_model_args, drafter_args, dtype_arg, dynamo_args, gamma_arg, lookahead_args,
                                   method_arg, mtad_args, sampling_args, early_layer_args, tree_args)
from latticedraft.cli.checks import check_model_limits, check_ranges, method_options, refuse_given
from latticedraft.errors import InputError
from latticedraft.outputs import FileKind


def run(a) -> int:
    """Check every option against the registry, load, then stream text or print JSON per batch."""
    from latticedraft.cli.options import prompt_inputs
    from latticedraft.decoding.runs.chat import check_chat, prompt_ids
    from latticedraft.decoding.runs.prompt_length import fit_prompts
    from latticedraft.decoding.runs.turns import Conversations, rounds

    from latticedraft.decoding.sources import check_config

    check_ranges(a)
    _check_output(a)
    method, options, sampling = method_options(a)
    check_config(options, model_dir_for(a, method), a.device)  # a source the model cannot run: before the load
    if method.check_files is not None:  # a missing file the options read (the n-gram LM): before the load too
        method.check_files(options, {f: getattr(a, f, None) for f in ("lm", "rescorer", "draft_model")})
    if a.output is not None:
        return _dataset(a, method, options, sampling)
    prompts = prompt_inputs(a)
    check_chat(prompts, a.chat, model_dir_for(a, method))  # from the files, before the model loads
    s = session_for(a, method)
    check_model_limits(a, s.model)
    ids = fit_prompts(s.model, prompt_ids(s, prompts, a.chat), a.max_new_tokens, a.truncate_left)
    batch = min(a.batch_size, len(ids))  # a batch holds at most the prompts there are
    s.prepare(method, options, batch)
    label = method.label(options, sampling)
    fit = lambda later, names: fit_prompts(s.model, later, a.max_new_tokens, a.truncate_left, names)  # noqa: E731
    talk = Conversations(s, prompts, fit)  # Spec-Bench's turns: each asked after the model's answer
    if a.json:  # records in input order, each written and flushed once it and those before it are done
        done, after = set(), [0]  # prompts whose conversation is over; the next to write

        def final(i):
            done.add(i)
            while after[0] in done:
                rec = {**talk.record(after[0]), "method": label}
                p = prompts[after[0]]
                print(json.dumps({"id": p.id, **rec} if hasattr(p, "id") else rec, ensure_ascii=False), flush=True)
                after[0] += 1

        def decode_round(index, round_ids, on_done):
            s.decode(round_ids, method.name, options, max_new_tokens=a.max_new_tokens, verify=a.verify,
                     batch_size=min(batch, len(round_ids)), sampling=sampling, rows=index, on_done=on_done)

        rounds(ids, decode_round, talk, final)
        return 0
    for row, p in enumerate(ids):
        for turn in talk.turns[row]:
            sys.stdout.write(turn + "\n" if a.chat else turn)  # a chat answer starts on its own line
            res = s.decode([p], method.name, options, max_new_tokens=a.max_new_tokens, verify=a.verify,
                           on_tokens=TextStream(s.tokenizer, sys.stdout), sampling=sampling, first_row=row)
            q = res.sequences[0]
            print()
            print(f"-- {len(q.tokens)} tokens, {q.calls} calls, block efficiency {q.block_efficiency:.2f}, "
                  f"{len(q.tokens) / max(q.seconds, 1e-9):.1f} tokens/s ({label}, verify {res.verify_mode}"
                  f"{dtype_note(s.dtype)})", file=sys.stderr)
            p = talk.done(row, res)
    return 0


def model_dir_for(a, method) -> str | None:
    """The model directory the command decodes with: ``--model``, else the method's bundled model
    (None: the bundled heads)."""
    from latticedraft.paths import data_dir

    return a.model if a.model is not None or method.default_model is None else str(data_dir() / method.default_model)


def dtype_note(dtype: str) -> str:
    """What a summary line adds where the weights are not float32 (their guarantee differs), else ""."""
    return "" if dtype == "float32" else f", {dtype} weights: may leave float32 greedy at near-ties"


def session_for(a, method, device=None):
    """The ``Session`` of the command's model options (the method's bundled model by default)."""
    from latticedraft.decoding.runs.session import Session

    model = model_dir_for(a, method)
    s = Session(model, a.tokenizer, getattr(a, "lm", None), getattr(a, "rescorer", None), device or a.device,
                a.threads, getattr(a, "draft_model", None), dtype=getattr(a, "dtype", None))
    s.notify = lambda m: print(m, file=sys.stderr)
    if getattr(a, "verbose", False) or getattr(a, "verbose_all", False):  # what was fitted, measured or loaded
        s.learned.notify = lambda m: print(f"[learned] {m}", file=sys.stderr)
    return s


def _check_output(a) -> None:
    """The data-set options need ``--output``; ``--output`` needs ``--prompts``; streaming text
    decodes one prompt at a time."""
    if a.output is None:
        refuse_given(a, tuple(DATASET), "it applies to a data set run, decode --prompts IN.jsonl --output OUT.jsonl")
        if not a.json:
            refuse_given(a, ("batch_size",), "prompts are decoded one at a time when streaming text; add --json "
                                             "or --output OUT.jsonl to decode them in batches")
        return
    if a.prompts is None:
        raise InputError("--output needs --prompts FILE.jsonl (- reads standard input); use --prompts for a data set")
    refuse_given(a, ("json",), "--output writes one JSON record per prompt already")


def _dataset(a, method, options, sampling) -> int:
    """``decode --prompts IN --output OUT``: resumable record file, sharded under torchrun."""
    from latticedraft.decoding.runs import dataset as dr
    from latticedraft.decoding.runs import shards
    from latticedraft.decoding.runs.chat import check_chat
    from latticedraft.decoding.runs.loaders import default_model_dir, default_rescorer_dir
    from latticedraft.decoding.runs.prompt_set import read_prompt_set, summarize_bad
    from latticedraft.paths import data_dir, default_lm_dir

    world = shards.world_from_env()
    if world.distributed and a.prompts == "-":
        raise InputError("--prompts - under a launcher: every rank reads the prompt set; give --prompts FILE.jsonl")
    prompts, bad = read_prompt_set(a.prompts, a.skip_bad, skip_option="--skip-bad")
    check_chat(prompts, a.chat, model_dir_for(a, method))  # from the files, before the model loads
    resolved = lambda p, default: None if p is None and default is None else str(Path(p or default).resolve())  # noqa: E731
    model = a.model or (data_dir() / method.default_model if method.default_model else default_model_dir())
    files = {"lm": resolved(a.lm, default_lm_dir()), "rescorer": resolved(a.rescorer, default_rescorer_dir()),
             "draft_model": resolved(a.draft_model, None), "adapter": resolved(a.adapter, data_dir() / "adapter-kangaroo"),
             "exit_heads": resolved(a.exit_heads, None), "cooccurrence": a.cooccurrence}
    settings = dr.run_settings(method, options, sampling, model=resolved(model, None),
                               tokenizer=resolved(a.tokenizer, None), max_new_tokens=a.max_new_tokens, verify=a.verify,
                               files=files)
    if a.truncate_left is not None:
        settings["truncate_left"] = a.truncate_left
    if a.chat:
        settings["chat"] = "every turn"  # not True: runs that decoded first turns only are other runs
    if a.dtype not in (None, "float32"):
        settings["dtype"] = a.dtype  # float32 runs keep the fingerprints they had before the option
    plan = dr.plan_output(a.output, world, settings, a.resume, prompts=a.prompts)
    loud = world.rank == 0 or not a.quiet_ranks
    if bad and world.rank == 0:
        print(summarize_bad(bad), file=sys.stderr)
    for path in plan.torn if loud else []:
        print(f"{path}: the last line is torn (a run was killed while writing it); that prompt is decoded again",
              file=sys.stderr)
    device = shards.device_for(world, a.device)
    shards.init(world, device)  # returns once every rank has joined, so after every rank's plan_output
    try:
        s = session_for(a, method, device)
        check_model_limits(a, s.model)
        work = dr.encode_shard(s, plan, prompts, a.max_new_tokens, a.truncate_left, a.chat)  # every length, before output
        s.prepare(method, options, min(a.batch_size, max(len(work.ids), 1)))
        summary = dr.decode_shard(s, plan, work, method=method.name, options=options, max_new_tokens=a.max_new_tokens,
                                  verify=a.verify, batch_size=a.batch_size, sort_by_length=a.sort_by_length,
                                  quiet_ranks=a.quiet_ranks, sampling=sampling, label=method.label(options, sampling))
        if loud:
            print(summary.line(world, a.output) + dtype_note(s.dtype), file=sys.stderr)
        merged = dr.finish_output(plan, prompts, device)
    finally:
        shards.finish(world)
    if merged is not None:
        n, extra = merged
        note = f", {len(extra)} of them for prompt ids not in --prompts (kept at the end)" if extra else ""
        print(f"wrote {a.output}: {n} records in prompt order{note}", file=sys.stderr)
    return 0


class TextStream:
    """Prints tokens as text while they arrive (byte-level BPE: decode the whole row each
    time and print the new suffix, so multi-byte characters never split)."""

    def __init__(self, tokenizer, file):
        self.tok, self.file, self.ids, self.shown = tokenizer, file, [], ""

    def __call__(self, row: int, new: list[int]) -> None:
        self.ids.extend(int(t) for t in new)
        text = self.tok.decode(self.ids)
        if text.startswith(self.shown):
            self.file.write(text[len(self.shown):])
            self.file.flush()
            self.shown = text


DATASET = {  # dest -> help of the switches of a data-set run (decode --output)
    "resume": "skip prompts that already have a complete record in OUT (same settings required); a torn last "
              "line is decoded again",
    "skip_bad": "leave out malformed lines, empty prompts and duplicate ids (counted on stderr) instead of "
                "refusing the file",
    "sort_by_length": "batch prompts of similar token length together; OUT still follows the input order",
    "quiet_ranks": "under torchrun, only rank 0 shows a progress bar and a summary",
}


def decode_options(*argv: str):
    """(``Method``, its options object) that ``latticedraft decode ARGV`` runs with: the CLI's
    defaults wherever ``argv`` is silent (for the demo and benchmarks that decode as the CLI does)."""
    from latticedraft.cli.parser import Parser, finish

    parser = Parser(prog="latticedraft")
    add_parser(parser.add_subparsers(dest="group", required=True))
    m, options, _ = method_options(finish(parser).parse_args(["decode", "--prompt", "x", *argv]))
    return m, options


def description() -> str:
    """``decode --help``'s description: which methods are lossless and which approximate, from the registry."""
    from latticedraft.decoding import registry

    table = registry.methods().values()
    lossless = [m.name for m in table if m.lossless]
    sampled = [m.name for m in table if m.lossless and m.sampling != "never"]
    lossy = [m.name for m in table if not m.lossless]
    return ("Decode prompts with any --method: stream the text, print one JSON object per prompt (--json), or write "
            f"a resumable data set (--output). The lossless methods ({', '.join(lossless)}) write exactly what "
            f"greedy decoding would, or with --do-sample ({', '.join(sampled)}) draw from the model's own "
            f"sampling distribution; {' and '.join(lossy)} sample approximately (not lossless). With no options: "
            "--method bpd with --drafter top1: the heads' top-1 drafts, context n-grams, where an n-gram LM build "
            "fits the tokenizer its continuations and, where a 4-bit forward pays, the model's own int4 copy "
            "(--self-draft auto), verified as one cost-aware tree per step.")


def _is_records(path) -> bool:
    """Whether file ``path`` starts with a record of ``decode --output``."""
    from latticedraft.decoding.runs.line_kinds import describe_line

    try:
        with open(path, "rb") as f:
            first = f.readline().rstrip(b"\n")
    except OSError:
        return False
    return bool(first) and describe_line(first) is None


RECORDS = FileKind("records of `decode --output`", "latticedraft decode --output", _is_records)


def _claim_output(a) -> None:
    """``--output``'s rule (``dataset.claim_output``): a new file, or with ``--resume`` records to continue."""
    if a.output is not None:
        from latticedraft.decoding.runs.dataset import claim_output

        claim_output(a.output, a.resume, a.prompts)


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import FILE, Output, declare

    p = groups.add_parser("decode", help="decode prompts with any --method (default bpd, lossless)",
                          description=description())
    method_arg(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help="prompt text; - reads it from standard input (default: --prompts)")
    src.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                     help="one {\"prompt\": ...} per line; - reads standard input (default: --prompt)")
    p.add_argument("--chat", action="store_true",
                   help="apply the model's chat template to each prompt (apply_chat_template(..., "
                        "add_generation_prompt=True)): a plain prompt is one user message; --prompts records may "
                        "hold {\"messages\": [...]} or Spec-Bench's {\"turns\": [...]} (every turn, each asked after "
                        "the model's own answer to those before it; a record of several turns gets \"turns\": one "
                        "record per turn)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--truncate-left", type=int, default=None, metavar="N",
                   help="keep the last N tokens of each prompt (prompt + --max-new-tokens must fit the model's "
                        "positions; default: refuse a prompt that does not)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts decoded together (at most as many as there are); needs --json or --output (default 1)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per prompt, each as soon as its batch completes, "
                        "instead of streaming text")
    d = p.add_argument_group("data sets (--prompts IN.jsonl --output OUT.jsonl; sharded when run under torchrun)")
    d.add_argument("-o", "--output", default=None, metavar="OUT.jsonl",
                   help="append one JSON record per prompt (with its id and the settings fingerprint) as each "
                        "batch completes, then order them as the prompts; - writes standard output")
    for dest, text in DATASET.items():
        d.add_argument("--" + dest.replace("_", "-"), action="store_true", help=text)
    declare(p, Output("--output", "output", FILE, (RECORDS,), claim=_claim_output, force="--resume",
                      inputs=("model", "tokenizer", "lm", "rescorer", "draft_model", "adapter", "exit_heads",
                              "lookahead_config")))  # --prompts: claim_output names it
    common_model_args(p)
    dtype_arg(p)
    drafter_args(p)
    tree_args(p)
    mtad_args(p)
    lookahead_args(p)
    early_layer_args(p)
    gamma_arg(p)
    sampling_args(p)
    dynamo_args(p)
    p.set_defaults(func=run)
