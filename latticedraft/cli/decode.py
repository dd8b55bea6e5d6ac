"""``latticedraft decode``: generate with any decoding method, streaming text, JSON lines or a resumable data-set run."""

from __future__ import annotations

import sys
from pathlib import Path

from latticedraft.cli.args import (
    common_model_args,
    drafter_args,
    dynamo_sampler_args,
    gamma_arg,
    lookahead_args,
    mtad_args,
    sampling_args,
    self_draft_args,
    set_threads,
    tree_args,
)
from latticedraft.cli.options import (
    drafter_spec,
    dynamo_config,
    lookahead_options,
    mtad_options,
    prompt_texts,
    sampling_options,
    self_draft_options,
)


def _cmd_decode(a) -> int:
    """``decode``: stream the continuation of each prompt, or one JSON object per prompt."""
    import json

    from latticedraft.cli.checks import check_decode, check_model_limits
    from latticedraft.decoding.runs.prompt_length import fit_prompts
    from latticedraft.decoding.runs.session import Session, TextStream, encode, records

    check_decode(a)
    if a.output is not None:
        return _cmd_decode_dataset(a)
    texts = prompt_texts(a)
    if a.method == "dynamo":
        return _cmd_decode_dynamo(a, texts)
    spec = drafter_spec(a)
    s = Session(a.model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads, getattr(a, "draft_model", None))
    s.notify = lambda m: print(m, file=sys.stderr)
    check_model_limits(a, s.model)
    ids = fit_prompts(s.model, encode(s.tokenizer, texts), a.max_new_tokens, a.truncate_left)
    look = lookahead_options(a) if a.method == "lookahead" else None
    smp, mtad, sd = sampling_options(a), mtad_options(a), self_draft_options(a)
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

    from latticedraft.cli.checks import check_model_limits
    from latticedraft.decoding.runs import dataset as dr
    from latticedraft.decoding.runs import shards
    from latticedraft.decoding.runs.prompt_set import read_prompt_set, summarize_bad
    from latticedraft.decoding.runs.session import Session, default_model_dir, default_rescorer_dir
    from latticedraft.paths import default_lm_dir

    world = shards.world_from_env()
    if world.distributed and a.prompts == "-":
        from latticedraft.errors import InputError

        raise InputError("--prompts - under a launcher: every rank reads the prompt set; give --prompts FILE.jsonl")
    spec = drafter_spec(a) if a.method == "bpd" else None
    prompts, bad = read_prompt_set(a.prompts, a.skip_bad)
    resolved = lambda p, default: str(Path(p if p is not None else default).resolve())  # noqa: E731
    settings = dr.run_settings(
        method=a.method, model=resolved(a.model, default_model_dir()),
        tokenizer=None if a.tokenizer is None else resolved(a.tokenizer, None), max_new_tokens=a.max_new_tokens,
        verify=a.verify, spec=spec, lm=resolved(a.lm, default_lm_dir()),
        rescorer=resolved(a.rescorer, default_rescorer_dir()),
        draft_model=None if a.draft_model is None else resolved(a.draft_model, None))
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
        s = Session(a.model, a.tokenizer, a.lm, a.rescorer, device, a.threads, a.draft_model)
        check_model_limits(a, s.model)
        if a.method == "bpd":
            s.prepare(spec, batch_size=a.batch_size)
        summary = dr.decode_shard(s, plan, prompts, method=a.method, spec=spec, max_new_tokens=a.max_new_tokens,
                                  verify=a.verify, batch_size=a.batch_size, sort_by_length=a.sort_by_length,
                                  quiet_ranks=a.quiet_ranks)
        if loud:
            print(summary.line(world, a.output), file=sys.stderr)
        merged = dr.finish_output(plan, prompts, device)
    finally:
        shards.finish(world)
    if merged is not None:
        n, extra = merged
        note = f", {len(extra)} of them for prompt ids not in --prompts (kept at the end)" if extra else ""
        print(f"wrote {a.output}: {n} records in prompt order{note}", file=sys.stderr)
    return 0


def _cmd_decode_dynamo(a, texts: list[str]) -> int:
    """``decode --method dynamo``: sample with the DynaMo heads; prints text, tokens per call and n per step."""
    import json

    from latticedraft.cli.checks import check_model_limits
    from latticedraft.decoding.dynamo.sampler import decode_texts, load_model, load_tokenizer_for
    from latticedraft.decoding.runs.prompt_length import fit_prompts
    from latticedraft.lm.cooccurrence import resolve_table

    cfg = dynamo_config(a)
    set_threads(a)
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


def add_parser(groups) -> None:
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
    common_model_args(p)
    drafter_args(p)
    tree_args(p)
    mtad_args(p)
    lookahead_args(p)
    self_draft_args(p)
    gamma_arg(p)
    sampling_args(p)
    dynamo_sampler_args(p)
    p.set_defaults(func=_cmd_decode)
