"""generate's arguments as a plain request for latticedraft's decode loop; whatever it cannot
honour is refused in one line naming the setting.

transformers calls a ``custom_generate`` function with everything ``model.generate`` received:
the input ids (``inputs``), ``generation_config``, generate's own arguments (``logits_processor``,
``streamer`` ...) and every keyword. ``read_request`` merges the generation settings as
``generate`` does (the given or the model's ``generation_config``, transformers' defaults, then
the keywords: ``model._prepare_generation_config``) and reads

- ``max_new_tokens`` (else ``max_length`` minus the input length), ``do_sample``, ``temperature``,
  ``top_k``, ``top_p``, ``repetition_penalty`` (sampling only), ``eos_token_id`` (an id or a
  list), ``pad_token_id`` and ``return_dict_in_generate``;
- the ``attention_mask`` (inferred from ``pad_token_id`` as generate does when absent): each row's
  left padding is stripped, so every prompt decodes as if alone;
- latticedraft's own keywords (``KEYWORDS``): ``heads=DIR``, ``seed=N`` (sampling; default drawn
  from torch's global generator, so ``torch.manual_seed`` repeats a run) and every option of
  ``latticedraft decode --method bpd`` by its Python name (``drafter=``, ``lm=``, ``nbest=``,
  ``tree=``, ``context_ngrams=`` ...).

A setting that changes what ``generate`` returns and is not among these (beam search, several
sequences per prompt, logits processors, stopping criteria, scores, ...) is refused with an
``InputError`` naming it; settings without effect on one greedy or sampled sequence (cache
layout, beam-only penalties at their defaults) pass.

    >>> r = read_request(model, ids, None, {"max_new_tokens": 8})     # doctest: +SKIP
    >>> r.prompts, r.max_new_tokens, r.eos_token_id, r.sampling
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from latticedraft.errors import InputError

# the generation settings read here; NO_EFFECT: settings that leave one greedy or sampled sequence as it is
READ = ("max_length", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
        "eos_token_id", "pad_token_id", "return_dict_in_generate")
NO_EFFECT = ("bos_token_id", "decoder_start_token_id", "use_cache", "cache_implementation", "cache_config",
             "max_cache_len", "early_stopping", "length_penalty", "num_assistant_tokens",
             "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
             "target_lookbehind", "max_matching_ngram_size", "is_assistant", "compile_config", "disable_compile",
             "remove_invalid_values", "renormalize_logits", "low_memory", "prefill_chunk_size",
             "transformers_version", "_from_model_config", "_commit_hash")
# generate's own arguments besides the settings: refused unless absent, empty or off
GENERATE_ARGUMENTS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "synced_gpus",
                      "assistant_model", "negative_prompt_ids", "negative_prompt_attention_mask")


def keywords() -> tuple[str, ...]:
    """latticedraft's own keywords: ``heads``, ``seed`` and ``--method bpd``'s option names."""
    from latticedraft.decoding.methods.bpd import METHOD

    return ("heads", "seed", *METHOD.options)


@dataclass
class GenerateRequest:
    """One ``generate`` call as plain values. input_ids: the ids as given [b, L] (left padding
    included: the output starts with them); prompts: each row without its padding (int64[t_i]);
    eos_token_id: the end ids (None: none); pad_token_id: what fills rows that ended early;
    sampling: ``SamplingOptions`` (None: greedy); options: latticedraft's keywords as given;
    streamer: transformers' streamer (batch of 1) or None."""

    input_ids: torch.Tensor
    prompts: list
    max_new_tokens: int
    eos_token_id: list | None
    pad_token_id: int
    sampling: object
    return_dict: bool
    options: dict = field(default_factory=dict)
    streamer: object = None


def read_request(model, inputs, generation_config, kwargs: dict) -> GenerateRequest:
    """``GenerateRequest`` of one call: ``inputs`` the input ids (or None when passed as
    ``input_ids=`` / ``inputs=`` in ``kwargs``), ``kwargs`` everything else transformers passed.
    ``InputError`` (one line, naming the setting) for what latticedraft cannot honour."""
    kwargs = dict(kwargs)
    ids = _input_ids(inputs, kwargs)
    streamer = kwargs.pop("streamer", None)
    for name in GENERATE_ARGUMENTS:
        value = kwargs.pop(name, None)
        if value is not None and value is not False and not (isinstance(value, (list, tuple)) and not value):
            raise InputError(f"generate({name}=...): latticedraft's custom_generate runs its own decode loop and "
                             f"cannot apply {name}; drop it, or call generate without custom_generate")
    ours = keywords()
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in ours}
    try:
        cfg, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
    except ValueError as e:  # transformers' own checks of the settings (num_return_sequences without sampling ...)
        raise InputError("generate: " + " ".join(str(e).split())) from None
    mask = model_kwargs.pop("attention_mask", None)
    if model_kwargs:
        name = min(model_kwargs)
        raise InputError(f"generate({name}=...) is not a setting latticedraft's custom_generate reads; it reads "
                         f"the generation settings {', '.join(READ)}, attention_mask, and its own keywords "
                         f"{', '.join(ours[:6])} ... (the options of `latticedraft decode --method bpd`); drop {name}")
    _check_settings(cfg)
    eos = _eos_ids(cfg.eos_token_id)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (eos[0] if eos else None)
    prompts = _prompts(ids, mask, pad, eos)
    max_new = _max_new_tokens(cfg, ids.shape[1])
    sampling = _sampling(cfg, options)
    if streamer is not None and len(prompts) != 1:
        raise InputError(f"generate(streamer=...) streams one sequence; got a batch of {len(prompts)} prompts: "
                         "decode them one at a time to stream")
    return GenerateRequest(ids, prompts, max_new, eos, 0 if pad is None else int(pad), sampling,
                           bool(cfg.return_dict_in_generate), options, streamer)


def _input_ids(inputs, kwargs: dict) -> torch.Tensor:
    given = [x for x in (inputs, kwargs.pop("inputs", None), kwargs.pop("input_ids", None)) if x is not None]
    if len(given) != 1:
        raise InputError("generate needs the input ids exactly once (generate(input_ids, ...)); "
                         f"got {len(given)} of inputs / input_ids")
    ids = given[0]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise InputError(f"input_ids {shape}: give an integer tensor [batch, length] (a tokenizer's "
                         "return_tensors='pt' ids)")
    if ids.shape[0] < 1 or ids.shape[1] < 1:
        raise InputError(f"input_ids of shape {tuple(ids.shape)}: give at least one prompt of at least one token")
    return ids


def _reference_config():
    """transformers' generation settings when nothing is set: what "off" means for each."""
    from transformers import GenerationConfig

    ref = GenerationConfig()
    defaults = getattr(GenerationConfig, "_get_default_generation_params", None)  # transformers >= 5
    if defaults is not None:
        ref.update(**defaults())
    return ref


def _off(value, ref) -> bool:
    if value is None or value is False:
        return ref is None or ref is False
    return value == ref


def _check_settings(cfg) -> None:
    """Refuse any generation setting that changes the output and is not read here."""
    ref = _reference_config().to_dict()
    for name, value in cfg.to_dict().items():
        if name in READ or name in NO_EFFECT or _off(value, ref.get(name)):
            continue
        raise InputError(f"generate({name}={value!r}): latticedraft's custom_generate decodes one sequence per "
                         "prompt, greedily or by sampling (max_new_tokens / max_length, do_sample, temperature, "
                         f"top_k, top_p, eos_token_id); drop {name}, or call generate without custom_generate")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise InputError(f"generate(max_new_tokens={cfg.max_new_tokens}): give at least 1")


def _eos_ids(eos) -> list | None:
    if eos is None:
        return None
    if isinstance(eos, torch.Tensor):
        eos = eos.reshape(-1).tolist()
    ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    if any(e < 0 for e in ids):
        raise InputError(f"generate(eos_token_id={eos!r}): end-of-text ids are token ids >= 0")
    return ids or None


def _prompts(ids: torch.Tensor, mask, pad, eos) -> list[np.ndarray]:
    """Each row's tokens without its left padding. ``mask`` None: inferred as generate does
    (rows are padded where ``pad`` occurs, unless ``pad`` is an end-of-text id: then unpadded)."""
    arr = ids.detach().cpu().numpy().astype(np.int64)
    if mask is None:
        if pad is not None and (arr == pad).any() and not (eos and pad in eos):
            mask = arr != pad
        else:
            mask = np.ones_like(arr, dtype=bool)
    else:
        mask = (mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)) != 0
        if mask.shape != arr.shape:
            raise InputError(f"attention_mask of shape {tuple(mask.shape)} does not match input_ids "
                             f"{tuple(arr.shape)}; pass the mask the tokenizer returned with the ids")
    out = []
    for i, (row, m) in enumerate(zip(arr, mask)):
        start = int(np.argmax(m)) if m.any() else len(m)
        if start == len(m) or not m[start:].all():
            raise InputError(f"attention_mask row {i} is not left padding (zeros, then at least one 1, then only 1s); "
                             "pad decoder-only inputs on the left (tokenizer.padding_side = 'left')")
        out.append(row[start:])
    return out


def _max_new_tokens(cfg, length: int) -> int:
    if cfg.max_new_tokens is not None:
        return int(cfg.max_new_tokens)
    room = int(cfg.max_length) - length
    if room < 1:
        raise InputError(f"generate(max_length={cfg.max_length}) leaves no room after an input of {length} tokens; "
                         "pass max_new_tokens=N (the tokens to generate)")
    return room


def _sampling(cfg, options: dict):
    """``SamplingOptions`` of generate's settings (None: greedy); the seed from ``seed=`` or,
    absent, drawn from torch's global generator (``torch.manual_seed`` repeats a run)."""
    from latticedraft.decoding.accept.sampling import SamplingOptions

    penalty = 1.0 if cfg.repetition_penalty is None else float(cfg.repetition_penalty)
    if not cfg.do_sample:
        if "seed" in options:
            raise InputError("generate(seed=...) applies to do_sample=True; drop seed or sample")
        if penalty != 1.0:
            raise InputError(f"generate(repetition_penalty={penalty}): latticedraft's greedy loop decodes the model's "
                             "own argmax; use the penalty with do_sample=True, or drop it")
        return None
    seed = options.pop("seed", None)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    return SamplingOptions(temperature=1.0 if cfg.temperature is None else float(cfg.temperature),
                           top_k=0 if cfg.top_k is None else int(cfg.top_k),
                           top_p=1.0 if cfg.top_p is None else float(cfg.top_p), seed=seed,
                           repetition_penalty=penalty)
