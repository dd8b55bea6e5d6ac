"""Loading what a decode needs, each in one place: the model (heads or a plain causal LM), its
tokenizer, the n-gram LM, the neural rescorer, the auxiliary draft model, Kangaroo's adapter and
PPD's exit heads; text in and out (``encode``, the end-of-text id).

Defaults (``latticedraft.paths``): model ``data/heads-stern`` (Stern heads on ``data/base``),
tokenizer ``data/tokenizer/tokenizer.json``, n-gram LM ``.cache/lm/stdlib-4gram``, neural
rescorer ``data/rescorer-small``, adapter ``data/adapter-kangaroo``. Every loader refuses a
missing or mismatched file in one line naming it and the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from latticedraft.errors import InputError
from latticedraft.paths import data_dir, default_lm_dir

EOS_TEXT = "<|endoftext|>"
DRAFT_MODEL_HINT = ("pass --draft-model DIR, a causal LM with the model's tokenizer (the bundled model: "
                    "data/rescorer-medium; SmolLM2: .cache/draft/smollm2 from `bash scripts/build_smollm2.sh --draft`; "
                    "another model: `latticedraft train draft-model --base MODEL_DIR ...`)")


def default_model_dir() -> Path:
    return data_dir() / "heads-stern"


def plain_model(model_dir) -> bool:
    """Whether ``model_dir`` (None: the default, which has heads) is a causal LM without heads
    (``config.json`` and no ``heads_config.json``), read from its files alone (no torch)."""
    d = Path(model_dir) if model_dir is not None else default_model_dir()
    return (d / "config.json").is_file() and not (d / "heads_config.json").is_file()


def default_rescorer_dir() -> Path:
    return data_dir() / "rescorer-small"


def check_model_dir(model_dir=None) -> Path:
    """The model directory ``model_dir`` names (None: the bundled heads), checked without loading it:
    ``InputError`` when it is empty or does not exist, naming the fix."""
    if model_dir is not None and str(model_dir) == "":
        raise InputError("--model '' is empty; pass --model DIR (a head directory or an HF causal LM directory)")
    path = Path(model_dir) if model_dir is not None else default_model_dir()
    if not path.exists():
        hint = " (the bundled heads: run `bash scripts/setup.sh` or `bash data/build.sh heads-stern`)" if model_dir is None else ""
        if model_dir is not None and str(model_dir).lower() == "smollm2":  # the demo's name for it is no directory
            hint = (" (SmolLM2 is `--model data/heads-smollm2` with its heads, or the directory `latticedraft fetch "
                    "smollm2` prints)")
        raise InputError(f"model directory {path} does not exist{hint}; pass --model DIR")
    return path


def base_dir_from_files(model_dir=None) -> Path:
    """The directory the base model of ``model_dir`` (None: the bundled heads) loads from, read from
    its files alone (no torch): a head directory's ``heads_config.json`` names it, relative to the
    head directory; any other model directory is its own base."""
    import json

    path = check_model_dir(model_dir)
    try:
        ref = json.loads((path / "heads_config.json").read_text(encoding="utf-8"))["base"]
    except (OSError, ValueError, KeyError, TypeError):  # no heads (or a config the loader will refuse)
        return path
    return (path / ref).resolve() if isinstance(ref, str) else path


def load_model(model_dir=None, device=None, dtype=None):
    """A ``BlockwiseModel`` from a head checkpoint, or a plain HF causal LM directory (then BPD
    has no heads and decodes one token per call)."""
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.models.blockwise import CONFIG_NAME, BlockwiseModel

    path = check_model_dir(model_dir)
    if (path / CONFIG_NAME).is_file():
        return BlockwiseModel.from_pretrained(path, device=device, dtype=dtype)
    return hf.load_causal_lm(path, device=device, dtype=dtype)


def base_dir_of(model, model_dir=None) -> str:
    """The directory ``AutoModelForCausalLM.from_pretrained`` loads the base model from."""
    ref = getattr(model, "base_ref", None)
    if ref:
        return str(ref)
    return str(Path(model_dir) if model_dir is not None else default_model_dir())


def load_tokenizer_for(model, model_dir=None, tokenizer_path=None):
    """The given tokenizer, else one beside the model/base, else the bundled one; checked
    against the model's vocabulary."""
    from latticedraft.gpu.models.hf import check_tokenizer_fits
    from latticedraft.lm.tokenizer import load_tokenizer

    if tokenizer_path is not None:
        path = Path(tokenizer_path)
    else:
        cands = [Path(model_dir) / "tokenizer.json" if model_dir else None,
                 Path(model.base_ref) / "tokenizer.json" if getattr(model, "base_ref", None) else None,
                 data_dir() / "tokenizer" / "tokenizer.json"]
        path = next((c for c in cands if c is not None and c.is_file()), None)
        if path is None:
            raise InputError("no tokenizer beside the model or in data/tokenizer; pass --tokenizer PATH")
    tok = load_tokenizer(path)
    check_tokenizer_fits(tok, getattr(model, "base", model), where=str(model_dir or "the model"))
    if tokenizer_path is not None:
        from latticedraft.decoding.runs.tokenizer_check import check_model_tokenizer

        check_model_tokenizer(tok, path, model_dir or default_model_dir(), getattr(model, "base_ref", None))
    return tok


def lm_for(tokenizer) -> Path:
    """The n-gram LM a model decodes with when ``--lm`` is not given: the bundled 4-gram where it was
    built with ``tokenizer`` (or is not built: loading it then says how), else the first LM build
    under ``.cache/lm/`` (name order) built with ``tokenizer`` (e.g. ``scripts/build_smollm2.sh``'s
    ``smollm2-4gram``), else the bundled one (whose load names the mismatch and the fix)."""
    import json

    from latticedraft import paths
    from latticedraft.lm.tokenizer import fingerprint

    fp = fingerprint(tokenizer)

    def fits(d: Path) -> bool:
        try:
            return json.loads((d / "manifest.json").read_text())["tokenizer"]["fingerprint"] == fp
        except (OSError, ValueError, KeyError, TypeError):
            return False

    bundled = paths.default_lm_dir()
    if not (bundled / "manifest.json").is_file() or fits(bundled):
        return bundled
    return next((d for d in sorted(bundled.parent.glob("*")) if d.is_dir() and fits(d)), bundled)


def require_lm(lm_dir=None, tokenizer=None, fix: str = "") -> Path:
    """The n-gram LM build ``load_lm`` loads: ``lm_dir`` (``--lm``), else ``lm_for(tokenizer)``, else
    (no tokenizer yet: before the model loads) the bundled 4-gram, which is what ``lm_for`` gives for
    any tokenizer while the bundled one is not built, so a missing LM is refused the same with or
    without one. ``InputError`` in one line naming the missing path and how to build or avoid it
    (``fix``: the options that decode without it, said after the builds)."""
    path = Path(lm_dir) if lm_dir is not None else (lm_for(tokenizer) if tokenizer is not None else default_lm_dir())
    if not path.exists():
        raise InputError(f"n-gram LM {path} not found; run `bash scripts/setup.sh` (builds the bundled 4-gram) "
                         f"or pass --lm DIR from `latticedraft lm build`{fix}")
    return path


def load_lm(lm_dir=None, tokenizer=None):
    """The n-gram LM build (``NgramLM``) at ``require_lm(lm_dir, tokenizer)``: default ``lm_for(tokenizer)``
    (the bundled 4-gram that set-up builds, for the bundled tokenizer)."""
    from latticedraft.lm.ngram import NgramLM

    return NgramLM.load(require_lm(lm_dir, tokenizer), tokenizer=tokenizer)


def load_rescorer(path=None, device=None, tokenizer=None):
    """A small causal LM for neural rescoring (default ``data/rescorer-small``)."""
    from latticedraft.gpu.models import hf

    p = Path(path) if path is not None else default_rescorer_dir()
    if not p.exists():
        raise InputError(f"neural rescorer {p} not found; pass --rescorer DIR (a causal LM with the model's vocabulary)")
    m = hf.load_causal_lm(p, device=device)
    if tokenizer is not None:  # the model's tokenizer is right: the rescorer is what does not fit
        given = "" if path is not None else " (the default neural rescorer, made for the bundled model)"
        hf.check_tokenizer_fits(tokenizer, m, where=f"--rescorer {p}{given}",
                                fix="pass --rescorer DIR, a causal LM trained with this model's tokenizer "
                                    "(`latticedraft train lm --tokenizer MODEL_DIR ...`)")
    return m.eval()


def load_draft_model(path, target, device=None, tokenizer=None):
    """The auxiliary draft model of ``--drafter model`` and ``--method mtad``: a causal LM whose
    vocabulary is the target's (same size, and the tokenizer fits it); refused otherwise."""
    from latticedraft.gpu.models import hf

    if path is None:
        raise InputError("--drafter model and --method mtad need an auxiliary draft model: pass --draft-model DIR "
                         "(e.g. data/rescorer-medium, a causal LM with the target's tokenizer)")
    p = Path(path)
    if not p.exists():
        raise InputError(f"--draft-model {p} does not exist; pass a causal LM directory with the target's tokenizer")
    m = hf.load_causal_lm(p, device=device, dtype=next(target.parameters()).dtype).eval()  # the target's dtype
    want, got = hf.model_vocab_size(getattr(target, "base", target)), hf.model_vocab_size(m)
    if want != got:
        raise InputError(f"--draft-model {p} has a vocabulary of {got} tokens, the target {want}; the draft model "
                         "must share the target's tokenizer")
    if tokenizer is not None:
        hf.check_tokenizer_fits(tokenizer, m, where=str(p))
        tok_file = p / "tokenizer.json"
        if tok_file.is_file():
            from latticedraft.lm.tokenizer import fingerprint, load_tokenizer

            if fingerprint(load_tokenizer(tok_file)) != fingerprint(tokenizer):
                raise InputError(f"--draft-model {p} ships a tokenizer.json different from the target's; the draft "
                                 "model must share the target's tokenizer")
    return m


def encode(tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Token ids of every text (int64[t]); an empty encoding is refused naming the prompt."""
    ids = [np.asarray(tokenizer.encode(t).ids, dtype=np.int64) for t in texts]
    for t, i in zip(texts, ids):
        if len(i) == 0:
            raise InputError(f"prompt {t!r} encodes to no tokens; give a non-empty prompt")
    return ids


def end_ids(model, tokenizer) -> list[int] | None:
    """The ids that end a sequence, as ``generate`` takes them: the HF base's
    ``generation_config.eos_token_id`` (an id or a list, e.g. Llama-3's several), else its
    ``config.eos_token_id``, else the tokenizer's ``<|endoftext|>``; None when there is none.

    >>> end_ids(smollm2, tok)          # doctest: +SKIP
    [2]                                # <|im_end|>, not <|endoftext|> (id 0)
    """
    base = getattr(model, "base", model)
    for cfg in (getattr(base, "generation_config", None), getattr(base, "config", None)):
        eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if eos is not None:
            ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
            if ids:
                return ids
    tid = tokenizer.token_to_id(EOS_TEXT)
    return None if tid is None else [int(tid)]


def load_adapter_for(model, path=None):
    """Kangaroo's adapter for ``model`` (default ``data/adapter-kangaroo``)."""
    from latticedraft.gpu.models.adapter import load_adapter
    from latticedraft.gpu.models.layer_split import LayerSplit

    return load_adapter(Path(path) if path else data_dir() / "adapter-kangaroo", LayerSplit(model))


def load_exit_heads_for(model, path):
    """PPD's per-layer early-exit heads for ``model`` from ``path`` (None: the shared LM head, no file)."""
    if path is None:
        return None
    from latticedraft.gpu.models.exit_heads import load_exit_heads
    from latticedraft.gpu.models.layer_split import LayerSplit

    return load_exit_heads(path, LayerSplit(model))
