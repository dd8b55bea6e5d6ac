"""``--method dynamo``: DynaMo's multi-token sampling (``dynamo/generate.py``) as a registry
entry: its options, their checks, its label and settings. APPROXIMATE sampling."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from latticedraft.decoding.registry import Method, sampling_options
from latticedraft.errors import InputError

if TYPE_CHECKING:
    from latticedraft.decoding.dynamo.sampler import DynamoConfig

OPTIONS = ("epsilon_b", "alpha_c", "unseen_weight", "max_n", "no_cooccurrence", "no_adaptive_threshold", "no_blur",
           "variant", "cooccurrence")


@dataclass(frozen=True)
class DynamoOptions:
    """config: the sampler's settings; table: ``--cooccurrence``, a co-occurrence file or LM build
    directory ("auto": the bundled build's, or counts made once on stdlib:train)."""

    config: DynamoConfig
    table: str = "auto"


def _configure(values: dict, given: set) -> DynamoOptions:
    from latticedraft.decoding.dynamo.sampler import VARIANTS, DynamoConfig, variant

    if "top_p" in given:
        raise InputError("--top-p does not apply to --method dynamo: it samples each head's top-k (--top-k, "
                         "--temperature); drop --top-p")
    s = sampling_options(METHOD, values)  # generate's ranges for temperature, top-k, repetition penalty, seed
    pick = lambda k, d: d if values.get(k) is None else values[k]  # noqa: E731
    cfg = DynamoConfig(epsilon_b=pick("epsilon_b", 0.5), top_k=s.top_k, temperature=s.temperature,
                       repetition_penalty=s.repetition_penalty, cooccurrence=not values.get("no_cooccurrence"),
                       alpha_c=pick("alpha_c", 1.0), unseen_weight=pick("unseen_weight", 0.5),
                       adaptive_threshold=not values.get("no_adaptive_threshold"), blur=not values.get("no_blur"),
                       max_n=values.get("max_n"))
    if values.get("variant"):
        if values["variant"] not in VARIANTS:
            raise InputError(f"--variant {values['variant']!r} is not one of {', '.join(VARIANTS)}")
        cfg = variant(values["variant"], cfg.epsilon_b, cfg)
    cfg.validate()
    return DynamoOptions(cfg, pick("cooccurrence", "auto"))


def _label(o: DynamoOptions, sampling) -> str:
    c = o.config
    return f"dynamo eps_b={c.epsilon_b} T={c.temperature} top-k={c.top_k} seed={sampling.seed} (approximate)"


def _settings(o: DynamoOptions, sampling) -> dict:
    return {**asdict(o.config), "cooccurrence": o.table, "seed": sampling.seed}


def _table(session, o: DynamoOptions):
    """The co-occurrence counts the sampler's mask needs (None when masking is off), checked
    against the model's vocabulary and the tokenizer."""
    from latticedraft.decoding.dynamo.generate import vocab_size
    from latticedraft.lm.tokenizer import fingerprint

    if not (o.config.cooccurrence and o.config.alpha_c > 0):
        return None
    cooc = session.cooccurrence(o.table)
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
    options=OPTIONS,
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    check=_check,
    defaults={"temperature": 0.7, "top_k": 50, "repetition_penalty": 1.1},
    files=lambda o: ("cooccurrence",),
    default_model="heads-dynamo",
)
