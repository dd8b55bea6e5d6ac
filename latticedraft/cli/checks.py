"""Checks the CLI runs on parsed options before it loads any model or writes anything.

Each check raises ``InputError`` with one line naming the option as typed and the fix.
``given(a, dest)`` tells whether an option was typed or differs from its default (the parser
stores the defaults and flag spellings of each command in ``a._defaults`` / ``a._flags``, and
the options typed in ``a._typed``), which is how
options that do not apply to the chosen method or drafter are refused instead of ignored.
"""

from __future__ import annotations

import math

from latticedraft.errors import InputError

def flag(a, dest: str) -> str:
    """The option string of ``dest`` as the command spells it (``--top-k``)."""
    return getattr(a, "_flags", {}).get(dest, "--" + dest.replace("_", "-"))


def given(a, dest: str) -> bool:
    """True when option ``dest`` was typed (even at its default value) or set to something other
    than its default."""
    defaults = getattr(a, "_defaults", {})
    return dest in defaults and (dest in getattr(a, "_typed", ()) or getattr(a, dest, None) != defaults[dest])


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


def given_dests(a) -> set[str]:
    """The option dests of the parsed command that were typed or differ from their defaults."""
    return {d for d in getattr(a, "_defaults", {}) if given(a, d)}


def check_ranges(a) -> None:
    """Ranges every decoding command shares (sizes >= 1, the device)."""
    check_device(getattr(a, "device", None))
    for d in ("max_new_tokens", "batch_size", "threads", "num_prompts", "truncate_left", "k", "nbest", "slots"):
        at_least(a, d, 1)
    at_least(a, "skip", 0)


def method_options(a, method: str | None = None):
    """(``Method``, its options object, ``SamplingOptions`` or None) of ``--method`` and the options
    the user set. An option ``--method`` does not read is refused by the method's own option check
    (``registry.refuse_unread``, which ``Session.configure`` passes through too), naming the
    methods that read it."""
    from latticedraft.decoding import registry

    m = registry.get(method or a.method)
    options = m.configure(option_values(a), given_dests(a))
    return m, options, sampling_for(a, m)


def option_values(a) -> dict:
    """The parsed options as dest -> value (argparse's bookkeeping left out)."""
    return {k: v for k, v in vars(a).items() if not k.startswith("_")}


def sampling_for(a, method):
    """``SamplingOptions`` of generate's flags for ``method`` (a registry ``Method``), or None; the
    flags without ``--do-sample`` are refused where the method samples only when asked."""
    from latticedraft.decoding import registry

    if method.sampling == "optional" and not getattr(a, "do_sample", False):
        for dest in registry.SAMPLING:
            if given(a, dest):
                raise InputError(f"{flag(a, dest)} does not apply without --do-sample: --method {method.name} "
                                 "decodes greedily; add --do-sample to sample")
    from latticedraft.decoding.accept.sampling import sampling_options

    return sampling_options(method, option_values(a))


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
