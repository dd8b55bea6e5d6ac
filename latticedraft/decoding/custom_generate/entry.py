"""``generate(model, input_ids, generation_config=None, **kwargs)``: what the exported
``custom_generate/generate.py`` runs when a transformers user calls
``model.generate(..., custom_generate=DIR, trust_remote_code=True)``.

It decodes with BPD on latticedraft's one decode loop (``registry`` method ``bpd``, through a
``Session`` wrapping ``model``), with the CLI's defaults (``--drafter top1 --tree auto
--context-ngrams 3 --lm-drafts auto --draft-vocab auto``) unless keywords say otherwise
(``arguments.py``). The heads come from ``heads=DIR`` (``latticedraft train heads``), by default
the bundled heads when ``model`` is the bundled base (recognised by its configuration and
embedding rows, not its path); ``drafter='none'`` needs no heads. Greedy output equals
``model.generate(do_sample=False)`` token for token in float32. In bfloat16 / float16 each kept
token is the argmax of the model's logits for its prefix as the verify forward (several positions
at once) computes them; that forward rounds differently from ``generate``'s one-position steps, so
where a step's top two logits lie within the dtype's rounding the output can differ, as
transformers' own prompt lookup can (``docs/half-precision.md``). With ``do_sample=True`` it is
lossless speculative sampling (the model's distribution).

Returns what ``generate`` returns: the sequences ``int64[b, L + n]`` (the input ids as given, then
each row's new tokens, ``pad_token_id`` after its end-of-text id up to the longest row), or with
``return_dict_in_generate=True`` a ``GenerateDecoderOnlyOutput`` (``LatticedraftGenerateOutput``)
that also holds each row's target ``calls`` and ``block_efficiency`` (new tokens per call).

Sessions (heads, LM, rescorer, measured step costs, fitted acceptance rates) are kept on the
model (``memo_of(model, "sessions")``), one per heads / files / device / dtype, and live as long
as it does; copies of the model start without them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.generation import GenerateDecoderOnlyOutput

from latticedraft.decoding.custom_generate.arguments import GenerateRequest, read_request
from latticedraft.errors import InputError, LatticedraftError
from latticedraft.memo import memo_of

FILES = ("lm", "rescorer", "draft_model")  # keywords naming files the session loads
VERIFY = ("auto", "tree", "batched")


@dataclass
class LatticedraftGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` (sequences; no scores, logits, attentions or hidden states)
    plus calls: int64[b] target model calls per row (the prefill included) and block_efficiency:
    float32[b] new tokens per call."""

    calls: torch.LongTensor | None = None
    block_efficiency: torch.FloatTensor | None = None


def generate(model, input_ids=None, generation_config=None, **kwargs):
    """Decode ``input_ids`` [b, L] (left-padded rows with an ``attention_mask``) with
    latticedraft; see the module docstring. ``LatticedraftError`` (one line naming the keyword
    or setting) for what it cannot honour."""
    try:
        req = read_request(model, input_ids, generation_config, kwargs)
        spec = _configure(req)
        session = session_for(model, req.options, spec)
        session.eos = req.eos_token_id  # this call's end ids (the session's default is its tokenizer's)

        def stream(row: int, new: list) -> None:
            req.streamer.put(torch.as_tensor(new, dtype=torch.long))

        if req.streamer is not None:
            req.streamer.put(req.input_ids.cpu())  # as generate does: the prompt first
        result = session.decode(req.prompts, "bpd", spec, max_new_tokens=req.max_new_tokens,
                                verify=req.options.get("verify") or "auto", batch_size=len(req.prompts),
                                sampling=req.sampling, on_tokens=stream if req.streamer is not None else None)
    except LatticedraftError as e:
        raise type(e)(as_keywords(str(e))) from None
    if req.streamer is not None:
        req.streamer.end()
    return _output(req, result)


def _configure(req: GenerateRequest):
    """``--method bpd``'s options object from the keywords (the rest: the CLI's defaults, as ``configure`` gives)."""
    from latticedraft.decoding import registry

    opts = {k: v for k, v in req.options.items() if k != "heads"}
    if opts.get("verify", "auto") not in VERIFY:
        raise InputError(f"generate(verify={opts['verify']!r}) is not one of {', '.join(VERIFY)}")
    values = {**opts, "do_sample": req.sampling is not None}
    return registry.get("bpd").configure(values, set(opts))


def session_for(model, options: dict, spec):
    """The ``Session`` decoding with ``model`` for these keywords (made once per heads, files,
    device and dtype; kept on the model)."""
    from latticedraft.decoding.drafters import HEADS
    from latticedraft.decoding.runs.loaders import default_model_dir

    heads = options.get("heads")
    if spec.name not in HEADS:
        if heads is not None:
            raise InputError(f"heads= does not apply to drafter={spec.name!r} (it drafts without heads); drop heads")
    elif heads is None:
        if not is_bundled_base(model):
            raise InputError("no heads= given, and this model is not latticedraft's bundled base (data/base) whose "
                             "heads are the default; pass heads=DIR (from `latticedraft train heads --base <its directory>`), "
                             "or drafter='none' (prompt lookup, no heads)")
        heads = default_model_dir()
    p = next(model.parameters())
    key = (None if heads is None else str(Path(heads).resolve()), *(options.get(f) for f in FILES), str(p.device),
           str(p.dtype))
    sessions = memo_of(model, "sessions")
    if key not in sessions:
        sessions[key] = _new_session(model, heads, options, p.device)
    return sessions[key]


def _new_session(model, heads, options: dict, device):
    from latticedraft.decoding.runs.session import Session
    from latticedraft.errors import ModelError
    from latticedraft.gpu.models.blockwise import BlockwiseModel

    home = model_home(model)
    target = model
    if heads is not None:
        training = model.training
        target = BlockwiseModel.from_pretrained(heads, base=model)  # (puts the heads and the model in eval mode)
        model.train(training)  # the model's mode stays the caller's, as with generate
        target.base_ref = str(home) if home is not None else target.base_ref
    try:
        return Session(heads if heads is not None else home, lm_dir=options.get("lm"),
                       rescorer_dir=options.get("rescorer"), device=device, draft_model_dir=options.get("draft_model"),
                       model=target)
    except ModelError as e:  # with the model given, the session loads only the tokenizer
        raise ModelError(f"{e}: latticedraft reads it from heads=DIR, the directory the model was loaded from "
                         f"({home or 'none: built in memory'}) or data/tokenizer; tokenizer.save_pretrained(DIR) "
                         "writes it") from None


def model_home(model) -> Path | None:
    """The directory ``model`` was loaded from (a local directory, or the Hub cache's snapshot),
    where its tokenizer.json may lie; None for a model built in memory."""
    name = str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "")
    if not name:
        return None
    if (Path(name) / "config.json").is_file():
        return Path(name).resolve()
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id=name, filename="config.json")
    except Exception:  # not a repository id: a model built in memory keeps whatever name it was given
        return None
    return Path(found).parent if isinstance(found, str) else None


def is_bundled_base(model) -> bool:
    """Whether ``model`` is latticedraft's bundled base (data/base): the same architecture, sizes
    and embedding rows (``adapter.fingerprint_mismatch``), in float32 or cast to half precision."""
    from latticedraft.errors import ModelError
    from latticedraft.gpu.models.adapter import fingerprint_mismatch
    from latticedraft.gpu.models.layer_split import LayerSplit

    bundled = _bundled_fingerprint()
    if bundled is None:
        return False
    cfg = model.config
    if (getattr(cfg, "model_type", None), getattr(cfg, "hidden_size", None)) != (bundled["model_type"],
                                                                                 bundled["hidden_size"]):
        return False
    try:
        return fingerprint_mismatch(bundled, LayerSplit(model)) is None
    except ModelError:
        return False


@functools.lru_cache(maxsize=1)
def _bundled_fingerprint() -> dict | None:
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.models.adapter import base_fingerprint
    from latticedraft.gpu.models.layer_split import LayerSplit
    from latticedraft.paths import data_dir

    where = data_dir() / "base"
    if not (where / "config.json").is_file():
        return None
    return base_fingerprint(LayerSplit(hf.load_causal_lm(where)))


def _output(req: GenerateRequest, result):
    """generate's return value: the padded sequences, or the output object with the counts."""
    ids = req.input_ids
    new = [s.tokens for s in result.sequences]
    width = max(len(t) for t in new)
    seq = torch.full((ids.shape[0], ids.shape[1] + width), req.pad_token_id, dtype=torch.long, device=ids.device)
    seq[:, :ids.shape[1]] = ids
    for i, t in enumerate(new):
        seq[i, ids.shape[1]:ids.shape[1] + len(t)] = torch.as_tensor(t, dtype=torch.long)
    if not req.return_dict:
        return seq
    return LatticedraftGenerateOutput(
        sequences=seq, calls=torch.tensor([s.calls for s in result.sequences], dtype=torch.long),
        block_efficiency=torch.tensor([s.block_efficiency for s in result.sequences], dtype=torch.float32))


_FLAG = re.compile(r"--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?: ([A-Z][A-Z_]*)\b)?")


def as_keywords(message: str) -> str:
    """A message of the shared checks with CLI flags as generate's keywords: ``--draft-model DIR``
    -> ``draft_model=DIR``, ``--nbest`` -> ``nbest`` (text in backticks, a command line, is kept)."""
    parts = message.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = _FLAG.sub(lambda m: m.group(1).replace("-", "_") + (f"={m.group(2)}" if m.group(2) else ""),
                             parts[i])
    return "`".join(parts)
