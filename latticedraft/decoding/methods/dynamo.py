"""``--method dynamo``: DynaMo's multi-token sampling (``dynamo/generate.py``) as a registry
entry: its options, their checks, its label and settings. APPROXIMATE sampling."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from latticedraft.decoding.dynamo.config import VARIANTS, DynamoConfig, variant
from latticedraft.decoding.registry import Method, configure, dests, option
from latticedraft.errors import InputError


@dataclass(frozen=True)
class DynamoOptions:
    """DynaMo's own options, each declaring its flag (the paper's defaults, Appendix A.1), and the
    generate settings it samples with (``sampling``: ``SamplingOptions``; its temperature, top-k and
    repetition penalty, whose DynaMo defaults are ``METHOD.defaults``); ``config``: the sampler's
    ``DynamoConfig`` of both. ``cooccurrence``: a co-occurrence file or LM build directory ("auto":
    the bundled build's, or counts made once on stdlib:train)."""

    epsilon_b: float = option(DynamoConfig.epsilon_b, group="dynamo", type=float, metavar="EPS",
                              help="back-off threshold ε_b in [0, 1]: 0 always emits n tokens, 1 always one")
    alpha_c: float = option(DynamoConfig.alpha_c, group="dynamo", type=float, metavar="A",
                            help="co-occurrence mask exponent α_c")
    unseen_weight: float = option(DynamoConfig.unseen_weight, group="dynamo", type=float, metavar="W",
                                  help="co-occurrence mask of pairs/triples the corpus lacks (0 = hard)")
    max_n: int | None = option(DynamoConfig.max_n, group="dynamo", type=int, metavar="N",
                               help="most tokens per call (default: the model's heads)")
    no_cooccurrence: bool = option(False, group="dynamo", action="store_true", help="turn co-occurrence masking off")
    no_adaptive_threshold: bool = option(False, group="dynamo", action="store_true",
                                         help="turn Otsu adaptive thresholding off")
    no_blur: bool = option(False, group="dynamo", action="store_true", help="no Gaussian blur before Otsu")
    variant: str | None = option(None, group="dynamo", choices=VARIANTS,
                                 help="an ablation variant (sets the three technique flags and α_c)")
    cooccurrence: str = option("auto", group="dynamo", metavar="PATH", help=(
        "co-occurrence table (file or LM build dir); auto: the bundled build's or one counted on stdlib:train"))
    sampling: object = None

    @property
    def config(self) -> DynamoConfig:
        s = self.sampling
        cfg = DynamoConfig(epsilon_b=self.epsilon_b, top_k=s.top_k, temperature=s.temperature,
                           repetition_penalty=s.repetition_penalty, cooccurrence=not self.no_cooccurrence,
                           alpha_c=self.alpha_c, unseen_weight=self.unseen_weight,
                           adaptive_threshold=not self.no_adaptive_threshold, blur=not self.no_blur, max_n=self.max_n)
        return variant(self.variant, cfg.epsilon_b, cfg) if self.variant else cfg


def _configure(values: dict, given: set) -> DynamoOptions:
    from latticedraft.decoding.accept.sampling import sampling_options

    if "top_p" in given:
        raise InputError("--top-p does not apply to --method dynamo: it samples each head's top-k (--top-k, "
                         "--temperature); drop --top-p")
    if values.get("variant") and values["variant"] not in VARIANTS:
        raise InputError(f"--variant {values['variant']!r} is not one of {', '.join(VARIANTS)}")
    # generate's ranges for temperature, top-k, repetition penalty, seed; then DynaMo's own
    o = replace(configure(DynamoOptions, values), sampling=sampling_options(METHOD, values))
    o.config.validate()
    return o


def _label(o: DynamoOptions, sampling) -> str:
    c = o.config
    return f"dynamo eps_b={c.epsilon_b} T={c.temperature} top-k={c.top_k} seed={sampling.seed} (approximate)"


def _settings(o: DynamoOptions, sampling) -> dict:
    return {**asdict(o.config), "cooccurrence": o.cooccurrence, "seed": sampling.seed}


def _table(session, o: DynamoOptions):
    """The co-occurrence counts the sampler's mask needs (None when masking is off), checked
    against the model's vocabulary and the tokenizer."""
    from latticedraft.decoding.dynamo.generate import vocab_size
    from latticedraft.lm.tokenizer import fingerprint

    if not (o.config.cooccurrence and o.config.alpha_c > 0):
        return None
    cooc = session.cooccurrence(o.cooccurrence)
    cooc.check(vocab_size=vocab_size(session.model), fingerprint=fingerprint(session.tokenizer))
    return cooc


def _check(session, o: DynamoOptions) -> None:
    """Before the co-occurrence counts are loaded or counted: a DynaMo-headed model fitting ``o``."""
    from latticedraft.decoding.dynamo.generate import check_model

    check_model(session.model, o.config, str(session.model_dir or "the model"))


def _prepare(session, o: DynamoOptions, batch_size: int) -> None:
    _table(session, o)


def _run(session, prompts, o: DynamoOptions, req):
    from latticedraft.decoding.dynamo.generate import generate
    from latticedraft.lm.tokenizer import fingerprint

    cfg = o.config
    return generate(session.model, prompts, cfg, _table(session, o), max_new_tokens=req.max_new_tokens,
                    seed=req.sampling.seed, eos_token_id=req.eos_token_id, rows=req.rows,
                    tokenizer_fingerprint=fingerprint(session.tokenizer), on_tokens=req.on_tokens)


METHOD = Method(
    name="dynamo",
    summary="DynaMo: samples 1..n tokens per call from its heads' joint (co-occurrence masking, Otsu threshold, "
            "back-off); APPROXIMATE sampling, needs DynaMo heads (default data/heads-dynamo)",
    lossless=False,
    sampling="always",
    options=dests(DynamoOptions),
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    check=_check,
    defaults={k: getattr(DynamoConfig, k) for k in ("temperature", "top_k", "repetition_penalty")},
    files=lambda o: ("cooccurrence",),
    default_model="heads-dynamo",
)
