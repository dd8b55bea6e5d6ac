"""Parsed options turned into the library's option objects (sampling, MTAD, DynaMo, self-drafting, lookahead, the drafter spec) and the prompts of ``--prompt`` / ``--prompts``."""

from __future__ import annotations

import argparse

from latticedraft.cli.args import gamma_of


def sampling_options(a):
    """``SamplingOptions`` of ``--do-sample`` (and of ``--method mtad``, which always samples);
    None: greedy."""
    method = getattr(a, "method", None)
    if not (getattr(a, "do_sample", False) or method == "mtad"):
        return None
    from latticedraft.decoding.accept.sampling import SamplingOptions

    mtad = method == "mtad"
    pick = lambda v, default: default if v is None else v  # noqa: E731
    return SamplingOptions(temperature=pick(a.temperature, 1.0), top_k=pick(a.top_k, 20 if mtad else 50),
                           top_p=pick(a.top_p, 0.9 if mtad else 1.0), seed=a.seed,
                           repetition_penalty=pick(a.repetition_penalty, 1.0))


def mtad_options(a):
    if getattr(a, "method", None) != "mtad":
        return None
    from latticedraft.decoding.proposers.mtad import MtadOptions

    return MtadOptions(gamma=gamma_of(a, 4), beams=a.beams, tau=a.tau)


def dynamo_config(a):
    from latticedraft.decoding.dynamo.sampler import DynamoConfig, variant

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


def self_draft_options(a):
    """``KangarooOptions`` / ``PPDOptions`` of ``--method kangaroo`` / ``ppd`` (None otherwise)."""
    if getattr(a, "method", None) == "kangaroo":
        from latticedraft.decoding.proposers.kangaroo import KangarooOptions

        return KangarooOptions(gamma=gamma_of(a, 6), eta=a.eta, adapter=a.adapter)
    if getattr(a, "method", None) == "ppd":
        from latticedraft.decoding.self_draft.ppd import PPDOptions

        return PPDOptions(dbar=a.exit_layer, k=a.candidates, exit_heads=a.exit_heads)
    return None


def self_draft_rows(a):
    """(KangarooOptions, PPDOptions) of eval's Kangaroo and PPD rows."""
    from latticedraft.cli.checks import check_self_draft
    from latticedraft.decoding.proposers.kangaroo import KangarooOptions
    from latticedraft.decoding.self_draft.ppd import PPDOptions

    # ranges only: eval runs both rows, so neither method's options are refused
    check_self_draft(argparse.Namespace(**{**{k: v for k, v in vars(a).items() if not k.startswith("_")},
                                           "method": None}))
    return (KangarooOptions(gamma=gamma_of(a, 6), eta=a.eta, adapter=a.adapter),
            PPDOptions(dbar=a.exit_layer, k=a.candidates, exit_heads=a.exit_heads))


def lookahead_options(a):
    from latticedraft.decoding.proposers.lookahead import LookaheadOptions

    if getattr(a, "lookahead_config", None):
        from latticedraft.decoding.eval.tune_lookahead import read_lookahead_config

        return LookaheadOptions(**read_lookahead_config(a.lookahead_config))
    return LookaheadOptions(W=a.window, N=a.ngram, G=a.pool, prompt_as_reference=a.prompt_as_reference)


def drafter_spec(a):
    from latticedraft.decoding.runs.session import DrafterSpec
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
    look = lookahead_options(a) if getattr(a, "lookahead_pool", False) else None
    return DrafterSpec(name=a.drafter, k=a.k, prune=a.prune, eps=a.eps, backoff=a.backoff, slots=a.slots,
                       alpha=a.alpha, nbest=a.nbest, draft_vocab=vocab, lookahead=look,
                       gamma=gamma_of(a, 4), **tree)


def prompt_texts(a) -> list[str]:
    """The prompts of ``--prompt TEXT`` (``-``: standard input) or ``--prompts FILE.jsonl`` (``-`` too)."""
    from latticedraft.decoding.runs.session import read_prompts
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
