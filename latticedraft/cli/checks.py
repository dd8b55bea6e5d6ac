"""Checks the CLI runs on parsed options before it loads any model or writes anything.

Each check raises ``InputError`` with one line naming the option as typed and the fix.
``given(a, dest)`` tells whether an option differs from its default (the parser stores the
defaults and flag spellings of each command in ``a._defaults`` / ``a._flags``), which is how
options that do not apply to the chosen method or drafter are refused instead of ignored.
"""

from __future__ import annotations

import math

from latticedraft.errors import InputError

# options of `decode` / `eval` by what they apply to
SAMPLING = ("do_sample", "epsilon_b", "seed", "top_k", "top_p", "temperature", "repetition_penalty", "alpha_c",
            "unseen_weight", "max_n", "no_cooccurrence", "no_adaptive_threshold", "no_blur", "variant", "cooccurrence")
GENERATE_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "seed", "repetition_penalty")  # generate's flags
DYNAMO_ONLY = tuple(d for d in SAMPLING if d not in GENERATE_SAMPLING)
MTAD = ("beams", "tau")
DRAFTING = ("drafter", "lm", "rescorer", "alpha", "nbest", "k", "prune", "eps", "backoff", "slots", "verify", "tree",
            "context_ngrams", "draft_vocab", "lookahead_pool", "draft_model", "gamma")
LOOKAHEAD = ("window", "ngram", "pool", "prompt_as_reference", "lookahead_config")
KANGAROO = ("adapter", "eta")  # --method kangaroo only (--gamma: kangaroo, mtad and --drafter model)
PPD = ("exit_layer", "candidates", "exit_heads")  # --method ppd only
DATASET = ("resume", "skip_bad", "sort_by_length", "quiet_ranks")  # decode --output only
# which bpd drafters use an option (the others ignore it, so it is refused)
DRAFTER_USES = {
    "lm": ("ngram", "parallel"),
    "rescorer": ("neural",),
    "alpha": ("ngram", "parallel", "neural"),
    "nbest": ("parallel", "parallel-base"),
    "draft_model": ("model",),
    "gamma": ("model",),
}
HEAD_DRAFTERS = ("top1", "neural", "ngram", "parallel", "parallel-base", "oracle")  # all but "none"
DRAFTER_USES.update({d: HEAD_DRAFTERS for d in ("k", "prune", "eps", "backoff", "slots", "draft_vocab")})


def flag(a, dest: str) -> str:
    """The option string of ``dest`` as the command spells it (``--top-k``)."""
    return getattr(a, "_flags", {}).get(dest, "--" + dest.replace("_", "-"))


def given(a, dest: str) -> bool:
    """True when option ``dest`` was set to something other than its default."""
    defaults = getattr(a, "_defaults", {})
    return dest in defaults and getattr(a, dest, None) != defaults[dest]


def refuse_given(a, dests, why: str) -> None:
    """``InputError`` for the first of ``dests`` that was given: it does not apply, ``why``."""
    for d in dests:
        if given(a, d):
            raise InputError(f"{flag(a, d)} does not apply here: {why}; drop {flag(a, d)}")


def check_device(device: str | None, opt: str = "--device") -> None:
    """``device`` must name a torch device this machine has (cpu, cuda, cuda:N, mps)."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"{opt} {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"{opt} {device}: this torch has no usable CUDA device; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"{opt} {device}: only {torch.cuda.device_count()} CUDA device(s) here; "
                             f"use cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise InputError(f"{opt} {device}: MPS is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise InputError(f"{opt} {device!r}: latticedraft runs on cpu, cuda or mps; use one of those")


def at_least(a, dest: str, low, none_ok: bool = True) -> None:
    """Option ``dest`` must be ``>= low`` (and finite)."""
    v = getattr(a, dest, None)
    if v is None and none_ok:
        return
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or v < low:
        raise InputError(f"{flag(a, dest)} {v} must be a number >= {low}")


def probability(a, dest: str) -> None:
    v = getattr(a, dest, None)
    if v is not None and not (0.0 <= v <= 1.0):
        raise InputError(f"{flag(a, dest)} {v} is not a probability in [0, 1]")


def finite(a, dest: str) -> None:
    v = getattr(a, dest, None)
    if v is not None and not math.isfinite(v):
        raise InputError(f"{flag(a, dest)} {v} must be a finite number")


def check_drafting(a) -> None:
    """Ranges of the drafting options shared by decode, eval and tune."""
    for d in ("k", "nbest", "slots", "max_new_tokens", "batch_size", "threads", "num_prompts"):
        at_least(a, d, 1)
    at_least(a, "skip", 0)
    for d in ("eps", "backoff"):
        probability(a, d)
    finite(a, "alpha")
    if getattr(a, "alpha", None) is not None and a.alpha < 0:
        raise InputError(f"{flag(a, 'alpha')} {a.alpha} must be >= 0 (the weight of the rescoring LM)")
    if given(a, "eps") and getattr(a, "prune", "none") == "none":
        raise InputError(f"{flag(a, 'eps')} applies to --prune static or otsu only; add --prune static or drop --eps")


def check_lookahead(a) -> None:
    """Ranges of --window / --ngram / --pool, or their refusal for a method other than lookahead."""
    if getattr(a, "method", None) == "bpd" and not getattr(a, "lookahead_pool", False):
        refuse_given(a, LOOKAHEAD, "--method bpd runs no Jacobi window unless asked (add --lookahead-pool, "
                                   "or use --method lookahead)")
        return
    if getattr(a, "method", None) not in ("bpd", "lookahead"):
        refuse_given(a, LOOKAHEAD, f"--method {a.method} has no Jacobi window or n-gram pool "
                                   "(those options apply to --method lookahead)")
        return
    check_lookahead_sizes(a)


def check_lookahead_sizes(a) -> None:
    """--window / --ngram / --pool ranges; a --lookahead-config file is read (it must be a tuner
    result) and may not be combined with the options it sets."""
    at_least(a, "window", 1)
    at_least(a, "ngram", 2)
    at_least(a, "pool", 0)
    if getattr(a, "lookahead_config", None):
        from latticedraft.decoding.eval.tune_lookahead import read_lookahead_config

        refuse_given(a, ("window", "ngram", "pool", "prompt_as_reference"),
                     f"--lookahead-config {a.lookahead_config} sets W, N, G and --prompt-as-reference")
        read_lookahead_config(a.lookahead_config)


def check_sampling(a, method: str) -> None:
    """generate's sampling flags: they need ``--do-sample`` (``--method mtad`` always samples);
    ranges as generate's; DynaMo's own options never apply to ``method``."""
    refuse_given(a, DYNAMO_ONLY, f"--method {method} samples with --do-sample / --temperature / --top-k / --top-p / "
                                 "--seed / --repetition-penalty only (the others apply to --method dynamo)")
    if method != "mtad" and not getattr(a, "do_sample", False):
        refuse_given(a, GENERATE_SAMPLING, f"--method {method} decodes greedily without --do-sample; add --do-sample "
                                           "to sample")
        return
    t = getattr(a, "temperature", None)
    if t is not None and not (math.isfinite(t) and t > 0):
        raise InputError(f"--temperature {t} must be a finite number > 0 (leave out --do-sample to decode greedily)")
    if getattr(a, "top_k", None) is not None and a.top_k < 0:
        raise InputError(f"--top-k {a.top_k} must be >= 0 (0 = no top-k filter)")
    p = getattr(a, "top_p", None)
    if p is not None and not (math.isfinite(p) and 0.0 < p <= 1.0):
        raise InputError(f"--top-p {p} must be in (0, 1] (1 = no nucleus filter)")
    r = getattr(a, "repetition_penalty", None)
    if r is not None and not (math.isfinite(r) and r > 0):
        raise InputError(f"--repetition-penalty {r} must be a finite number > 0 (1 = off)")


def check_mtad(a) -> None:
    """``--method mtad``: an auxiliary draft model and MTAD's ranges; no head drafting options."""
    if a.method != "mtad":
        refuse_given(a, MTAD, "it applies to --method mtad")
        return
    refuse_given(a, tuple(d for d in DRAFTING if d not in ("verify", "draft_model", "gamma")),
                 "--method mtad drafts with the auxiliary --draft-model, not from heads (the drafting options "
                 "apply to --method bpd)")
    if getattr(a, "draft_model", None) is None:
        raise InputError("--method mtad needs an auxiliary draft model: pass --draft-model DIR (e.g. data/rescorer-medium)")
    at_least(a, "gamma", 1)
    at_least(a, "beams", 1)
    if not (math.isfinite(a.tau) and a.tau >= 0):
        raise InputError(f"--tau {a.tau} must be a number >= 0 (>= 1: ordinary sampling from the target)")


def check_self_draft(a) -> None:
    """Ranges of the Kangaroo / PPD options, or their refusal for another method."""
    m = getattr(a, "method", None)
    if m != "kangaroo":
        refuse_given(a, KANGAROO, f"--method {m} has no early-exit adapter (those options apply to --method kangaroo)")
    if m != "ppd":
        refuse_given(a, PPD, f"--method {m} makes no early prediction (those options apply to --method ppd)")
    at_least(a, "gamma", 1)
    at_least(a, "candidates", 1)
    at_least(a, "exit_layer", 1)
    eta = getattr(a, "eta", None)
    if eta is not None and not (0.0 <= eta < 1.0):
        raise InputError(f"{flag(a, 'eta')} {eta} must lie in [0, 1): drafting stops at a top-1 probability <= eta")


def check_decode(a) -> None:
    """Everything ``decode`` can check before loading: ranges, and options that do not apply."""
    check_device(a.device)
    at_least(a, "truncate_left", 1)
    check_drafting(a)
    check_output(a)
    check_lookahead(a)
    check_mtad(a)
    check_self_draft(a)
    if a.method in ("kangaroo", "ppd"):
        refuse_given(a, SAMPLING, f"--method {a.method} decodes greedily (the sampling options apply to --method bpd, "
                                  "lookahead, mtad and dynamo)")
        refuse_given(a, tuple(d for d in DRAFTING if not (d == "gamma" and a.method == "kangaroo")),
                     f"--method {a.method} drafts from the model's own early layers, not from heads "
                     "(the drafting options apply to --method bpd)")
        if getattr(a, "output", None) is not None:
            raise InputError(f"--output (resumable dataset decoding) runs --method bpd, greedy or lookahead; "
                             f"decode --method {a.method} with --json instead")
        if not a.json:
            refuse_given(a, ("batch_size",), "prompts are decoded one at a time when streaming text; add --json "
                                             "to decode them in batches")
        return
    if a.method in ("lookahead", "mtad"):
        check_sampling(a, a.method)
        if a.method == "lookahead":
            refuse_given(a, tuple(d for d in DRAFTING if d != "verify"),
                         "--method lookahead drafts from its own Jacobi window and n-gram pool, not from heads "
                         "(the drafting options apply to --method bpd)")
        if not a.json:
            refuse_given(a, ("batch_size",), "prompts are decoded one at a time when streaming text; add --json "
                                             "to decode them in batches")
        return
    if a.method == "dynamo":
        refuse_given(a, DRAFTING, "--method dynamo samples from the DynaMo heads without a drafter "
                                  "(the drafting options apply to --method bpd)")
        refuse_given(a, ("batch_size",), "--method dynamo decodes one prompt at a time")
        refuse_given(a, ("top_p", "do_sample"), "--method dynamo always samples each head's top-k (--do-sample and "
                                                "--top-p apply to --method bpd, lookahead and mtad)")
        return
    if a.method == "greedy":
        refuse_given(a, SAMPLING, "--method greedy decodes greedily; the sampling options apply to --method bpd, "
                                  "lookahead and mtad (with --do-sample) and dynamo")
        refuse_given(a, DRAFTING, "--method greedy is plain autoregressive decoding without drafts "
                                  "(the drafting options apply to --method bpd)")
    else:
        check_sampling(a, a.method)
        if getattr(a, "do_sample", False):
            if a.drafter == "oracle":
                raise InputError("--drafter oracle drafts the greedy output; choose another drafter with --do-sample")
            why = ("--do-sample verifies the drafted paths as drawn (no cost-aware tree, context n-grams or "
                   "lookahead pool: choices that look at sampled tokens would bias them)")
            refuse_given(a, ("lookahead_pool",), why)
            if given(a, "context_ngrams") and a.context_ngrams:
                raise InputError(f"--context-ngrams {a.context_ngrams} does not apply here: {why}; drop it")
        for dest, users in DRAFTER_USES.items():
            if a.drafter not in users:
                refuse_given(a, (dest,), f"--drafter {a.drafter} does not use it (it applies to --drafter "
                                         f"{' / '.join(users)})")
        if a.drafter == "model" and getattr(a, "draft_model", None) is None:
            raise InputError("--drafter model needs an auxiliary draft model: pass --draft-model DIR "
                             "(e.g. data/rescorer-medium)")
    if not a.json and getattr(a, "output", None) is None:
        refuse_given(a, ("batch_size",), "prompts are decoded one at a time when streaming text; add --json "
                                         "or --output OUT.jsonl to decode them in batches")


def check_output(a) -> None:
    """``decode --output``: a data set run over ``--prompts``; its options need it."""
    if getattr(a, "output", None) is None:
        refuse_given(a, DATASET, "it applies to a data set run, decode --prompts IN.jsonl --output OUT.jsonl")
        return
    if a.prompts is None:
        raise InputError("--output needs --prompts FILE.jsonl (- reads standard input); use --prompts for a data set")
    refuse_given(a, ("truncate_left",), "a data set run decodes its prompts as given; truncate them in IN.jsonl")
    refuse_given(a, ("json",), "--output writes one JSON record per prompt already")
    if a.method in ("dynamo", "lookahead", "mtad") or getattr(a, "do_sample", False):
        raise InputError(f"--output applies to --method bpd and greedy without --do-sample; for --method {a.method}"
                         f"{' --do-sample' if getattr(a, 'do_sample', False) else ''} use --json")


def check_model_limits(a, model) -> None:
    """Options bounded by the loaded model: ``--slots`` by its heads, ``--k`` by its vocabulary."""
    from latticedraft.gpu.models.hf import model_vocab_size

    heads = getattr(model, "num_heads", 1)
    slots = getattr(a, "slots", None)
    if slots is not None and slots > heads - 1:
        raise InputError(f"--slots {slots}: the model has {heads} heads, so 1..{max(heads - 1, 1)} extra heads "
                         "can be drafted from; lower --slots")
    vocab = model_vocab_size(getattr(model, "base", model))
    k = getattr(a, "k", None)
    if given(a, "k") and k > vocab:  # defaults are clamped to small vocabularies by the library
        raise InputError(f"--k {k} is larger than the vocabulary ({vocab} tokens, the model's); use --k 1..{vocab}")
    top_k = getattr(a, "top_k", None)
    if given(a, "top_k") and top_k > vocab:
        raise InputError(f"--top-k {top_k} is larger than the vocabulary ({vocab} tokens, the model's); "
                         f"use --top-k 1..{vocab}")
