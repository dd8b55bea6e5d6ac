"""``import_gguf``: a GGUF file (llama.cpp's format, quantized or not) as a float32 HF model directory.

transformers reads the file (``from_pretrained(dir, gguf_file=name)``, which needs the ``gguf`` and
``accelerate`` packages) and dequantizes every tensor; the model is written with
``save_pretrained`` as ``config.json``, ``generation_config.json`` (the file's end-of-text id as
``eos_token_id``, its padding id, else that one, as ``pad_token_id``), ``model.safetensors``
(float32), the tokenizer (``tokenizer.json``, ``tokenizer_config.json``) and its chat template
(``chat_template.jinja``, when the file carries one), plus the marker ``gguf_import.json`` (source
name, sha256 and size, architecture, parameter count, library versions) by which a later
``--force`` recognises the output (``outputs.GGUF_IMPORT``). Written atomically.

    >>> r = import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")     # doctest: +SKIP
    >>> r.parameters, r.out_dir                                             # 134515008, smollm2
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from latticedraft import __version__
from latticedraft.atomic import atomic_dir
from latticedraft.errors import InputError, ModelError
from latticedraft.outputs import GGUF_IMPORT, claim_dir, remove_stale
from latticedraft.outputs import MARKER_GGUF_IMPORT as MARKER
from latticedraft.quiet import libraries_speaking

MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file


@dataclass
class GGUFImport:
    """What ``import_gguf`` wrote: ``parameters`` (count, tied weights once), ``model_type``
    ("llama"), ``architecture`` ("LlamaForCausalLM"), ``eos_token_id`` (int, list or None),
    ``seconds`` (wall time of the whole import)."""

    out_dir: Path
    source: Path
    model_type: str
    architecture: str
    parameters: int
    dtype: str
    eos_token_id: int | list | None
    seconds: float


def count_text(n: int) -> str:
    """A parameter count for messages: "134.5 M", "39.1 k", "1.7 B"."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return str(n)


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_gguf_file(src, shown=None) -> Path:
    """``src`` if it is a readable file starting with the GGUF magic bytes, else ``InputError`` (naming
    it as ``shown``, default ``src``)."""
    from latticedraft.paths import require_file

    p = require_file(src, "GGUF file", "pass the path of a .gguf file (llama.cpp's format)")
    with open(p, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise InputError(f"{shown or p} is not a GGUF file (it starts with {head!r}, not {MAGIC!r}); pass a .gguf "
                         "file written by llama.cpp or the gguf package")
    return p


def _require_packages() -> None:
    for pkg in ("gguf", "accelerate"):
        if find_spec(pkg) is None:
            raise InputError(f"the {pkg} package is not installed, and transformers needs it to read GGUF files; "
                             f"run `.venv/bin/pip install {pkg}` (or `bash scripts/setup.sh`)")


@contextlib.contextmanager
def _alone(src: Path):
    """A directory holding only ``src`` (a link to it), so that no config.json or tokenizer file
    lying beside the GGUF mixes into what transformers reads; ``src``'s own directory where links fail."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="latticedraft-gguf-") as tmp:
        try:
            (Path(tmp) / src.name).symlink_to(src.resolve())
        except OSError:
            tmp = str(src.parent)
        yield tmp


def _unreadable(shown, what: str, e: Exception, where: str) -> InputError:
    """transformers' failure to read ``shown``, its message rid of ``where`` (the temporary directory
    it was read from, gone by the time the user reads the message)."""
    import transformers

    from latticedraft.gpu.models.hf import brief

    text = str(e)
    fix = ("convert the model to a GGUF of an architecture transformers can dequantize (llama, mistral, qwen2, "
           "gemma, phi3, ...) or upgrade transformers" if "not supported" in text or "Supported" in text
           else "check the file: download or convert it again")
    gist = brief(e).replace(where.rstrip("/") + "/", "").replace(where, ".")
    return InputError(f"transformers {transformers.__version__} cannot read the {what} in {shown} ({gist}); {fix}")


def _load(src: Path, shown):
    """(model in float32 with transformers' GGUF quantizer detached, tokenizer) read from ``src``
    (``shown``: its name in messages); transformers' own bars dropped (``quiet.libraries_speaking``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from latticedraft.gpu.train.data import quiet_hf_progress

    quiet_hf_progress()
    kw = {"gguf_file": src.name}
    try:  # newer transformers keeps some architectures' weights packed unless told to dequantize
        from transformers import GgufConfig

        kw["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    with _alone(src) as where, libraries_speaking():
        try:
            model, info = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, output_loading_info=True,
                                                               **kw)
        except Exception as e:
            raise _unreadable(shown, "model", e, where) from e
        try:
            tok = AutoTokenizer.from_pretrained(where, gguf_file=src.name)
        except Exception as e:
            raise _unreadable(shown, "tokenizer", e, where) from e
    _check_complete(info, shown)
    _detach_quantizer(model)
    model = model.float().eval()
    return model, tok


def _check_complete(info: dict, src) -> None:
    """``InputError`` when the file lacks weights the model needs (transformers would start them at
    random) or holds tensors it could not place."""
    from latticedraft.gpu.models.hf import loading_problem

    problem = loading_problem(info)
    if problem is not None:
        what = {"missing_keys": "lacks weights the model needs",
                "mismatched_keys": "holds weights of other shapes than its metadata describes",
                "unexpected_keys": "holds tensors transformers cannot place"}[problem[0]]
        raise InputError(f"{src} {what} ({problem[1]}); it does not follow llama.cpp's naming for its "
                         "architecture: convert the model again with llama.cpp's convert_hf_to_gguf.py")


def _detach_quantizer(model) -> None:
    """Forget the GGUF quantizer ``from_pretrained`` attached (``save_pretrained`` refuses while it is
    there, and ``config.json`` would ask for it again): its ``remove_quantization_config``, else by hand."""
    q = getattr(model, "hf_quantizer", None)
    if q is not None and hasattr(q, "remove_quantization_config"):
        q.remove_quantization_config(model)
    for obj, name in ((model, "hf_quantizer"), (model.config, "quantization_config"), (model, "quantization_method")):
        with contextlib.suppress(AttributeError):
            delattr(obj, name)
    model.is_quantized = False


def _set_end_ids(model, tok) -> None:
    """``generation_config``: the file's end-of-text id (``tokenizer.ggml.eos_token_id``) as ``eos_token_id``,
    its padding id, else the end-of-text id, as ``pad_token_id``."""
    gc, cfg = model.generation_config, model.config
    eos = getattr(cfg, "eos_token_id", None)
    eos = eos if eos is not None else tok.eos_token_id
    pad = getattr(cfg, "pad_token_id", None)
    pad = pad if pad is not None else tok.pad_token_id
    if eos is not None:
        gc.eos_token_id = eos
    pad = pad if pad is not None else (eos[0] if isinstance(eos, list) else eos)
    if pad is not None:
        gc.pad_token_id = pad
    bos = getattr(cfg, "bos_token_id", None)
    if bos is not None:
        gc.bos_token_id = bos


def import_gguf(src, out, force: bool = False, shown=None) -> GGUFImport:
    """Read GGUF file ``src`` and write it as a float32 HF model directory ``out`` (module docstring).

    ``InputError`` before any work when ``src`` is missing or not a GGUF file, when ``out`` is
    ``src``'s own directory, or when ``out`` holds anything but an earlier import (that one only
    with ``force``: ``outputs.claim_dir``); also when transformers cannot read the file (one line,
    naming its reason). Messages name the file as ``shown`` (default ``src``: a caller that unpacked
    it to a temporary path names where it came from). Nothing is left behind on failure."""
    t0 = time.perf_counter()
    src = check_gguf_file(src, shown)
    shown = shown or src
    out = Path(out)
    claim_dir(out, GGUF_IMPORT, force=force, flag="--out", inputs={"FILE": src})
    _require_packages()
    model, tok = _load(src, shown)
    _set_end_ids(model, tok)
    params = sum(p.numel() for p in model.parameters())
    import gguf
    import transformers

    meta = {"format": "latticedraft-gguf-import", "version": 1,
            "source": {"file": src.name, "sha256": sha256(src), "bytes": src.stat().st_size},
            "model_type": model.config.model_type, "architecture": type(model).__name__, "parameters": params,
            "dtype": "float32", "eos_token_id": model.generation_config.eos_token_id,
            "versions": {"latticedraft": __version__, "transformers": transformers.__version__,
                         "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf")}}
    with atomic_dir(out) as stage, libraries_speaking():
        model.save_pretrained(stage)
        tok.save_pretrained(stage)
        if not (stage / "tokenizer.json").is_file():
            raise ModelError(f"transformers wrote no tokenizer.json for {shown} (its tokenizer is a "
                             f"{type(tok).__name__}); latticedraft reads tokenizers from tokenizer.json, so this "
                             "GGUF's tokenizer cannot be used here")
        (stage / MARKER).write_text(json.dumps(meta, indent=1) + "\n")
        written = {p.name for p in stage.iterdir()}
    remove_stale(out, GGUF_IMPORT, written)
    return GGUFImport(out, src, model.config.model_type, type(model).__name__, params, "float32",
                      model.generation_config.eos_token_id, time.perf_counter() - t0)


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
