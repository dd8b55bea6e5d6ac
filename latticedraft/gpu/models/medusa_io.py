"""Medusa heads in the serving engines' layouts: ``import_medusa`` reads vLLM's and FasterDecoding's
checkpoints into a head directory, ``export_medusa`` writes vLLM's.

vLLM (``speculative_config={"method": "medusa", "model": DIR}``; its ``configs/medusa.py`` and
``models/medusa.py``) reads a directory holding

- ``config.json``: ``model_type: "medusa"``, ``hidden_size``, ``vocab_size``, ``num_heads``,
  ``num_hidden_layers`` (any key holding "num" and "heads" / "layers" is read as these), and
  optionally ``medusa_fc_bias``, ``original_lm_head``, ``logit_scale``, ``truncated_vocab_size``;
- ``model.safetensors`` (a ``medusa_heads.`` prefix is dropped): ``blocks.{i}.layers.{l}.weight``
  ``[H, H]`` (and ``.bias [H]`` with ``medusa_fc_bias``), ``lm_heads.{i}.weight [V, H]``; with
  ``original_lm_head`` one ``lm_heads.0.weight`` (the base's LM head) serves every head.

FasterDecoding's Medusa writes ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
``base_model_name_or_path``) and ``medusa_lm_head.pt`` or ``.safetensors`` holding
``[medusa_head.]{i}.{l}.linear.weight`` / ``.bias`` and ``[medusa_head.]{i}.{L}.weight`` (the LM head
after the ``L`` blocks).

Medusa head ``i`` (0-based) predicts token ``t+i+2``: it is latticedraft's head ``i+2``, so ``n``
Medusa heads make a ``BlockwiseModel`` of ``n + 1`` heads (``kind: "medusa"``). A truncated draft
vocabulary (``token_map``) is refused: these heads predict over the whole vocabulary (decode's
``--draft-vocab`` reduces the drafting vocabulary instead).

Both follow the one overwrite rule (``outputs.claim_dir``): each writes its own marker beside what
it writes (``medusa_import.json``, ``medusa_export.json``), so ``--force`` replaces only its own
earlier output, never a model, another command's output or its own input.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from latticedraft.atomic import atomic_dir
from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf
from latticedraft.outputs import (MARKER_MEDUSA_EXPORT, MARKER_MEDUSA_IMPORT, MEDUSA_EXPORT, MEDUSA_IMPORT, claim_dir,
                                  remove_stale)

WEIGHT_FILES = ("model.safetensors", "medusa_lm_head.safetensors", "pytorch_model.bin", "medusa_lm_head.pt")
# config keys that describe the heads' shape: written by export from the heads, never copied from a source
_SHAPE_KEYS = ("model_type", "hidden_size", "vocab_size", "num_heads", "num_hidden_layers", "medusa_fc_bias",
               "original_lm_head", "logit_scale", "truncated_vocab_size", "medusa_num_heads", "medusa_num_layers")
_OPTIONAL = {"medusa_fc_bias": False, "original_lm_head": False, "logit_scale": 1.0}  # vLLM's defaults


@dataclass
class MedusaCheckpoint:
    """Medusa heads as read from a directory: ``n`` heads of ``L`` residual blocks on hidden size ``H``.

    w: [n, L, H, H]; b: [n, L, H] or None (no block bias: ``fc_bias`` false); lm: [n, V, H] (one LM head each) or
    None with ``shared_lm [V, H]`` (vLLM's ``original_lm_head``: one LM head for all heads).
    layout: "vllm" | "fasterdecoding"; config: the source's config.json as read."""

    w: torch.Tensor
    b: torch.Tensor | None
    fc_bias: bool
    lm: torch.Tensor | None
    shared_lm: torch.Tensor | None
    logit_scale: float
    layout: str
    config: dict
    dtype: torch.dtype

    @property
    def num_heads(self) -> int:
        return int(self.w.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.w.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self.w.shape[-1])

    @property
    def vocab_size(self) -> int:
        return int((self.lm[0] if self.lm is not None else self.shared_lm).shape[0])


def _read_config(src: Path) -> dict:
    f = src / "config.json"
    if not f.is_file():
        raise ModelError(f"{src} has no config.json; pass a Medusa checkpoint directory (vLLM's or FasterDecoding's layout)")
    try:
        cfg = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{f} is not valid JSON ({e}); copy the checkpoint again") from e
    if not isinstance(cfg, dict):
        raise ModelError(f"{f} is not a JSON object; pass a Medusa checkpoint directory")
    return cfg


def _read_weights(src: Path) -> tuple[Path, dict]:
    for name in WEIGHT_FILES:
        f = src / name
        if not f.is_file():
            continue
        if f.suffix == ".safetensors":
            return f, hf.load_safetensors(f)
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ModelError(f"{f} cannot be read as a torch state dict ({hf.brief(e)}); copy or re-save it") from e
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ModelError(f"{f} is not a state dict of tensors; pass the heads' weights file")
        return f, state
    raise ModelError(f"{src} holds none of {', '.join(WEIGHT_FILES)}; pass a Medusa checkpoint directory "
                     "(a sharded checkpoint must be merged into one file first)")


def _config_count(cfg: dict, what: str) -> int | None:
    """``num_heads`` / ``num_hidden_layers`` as vLLM reads them: the key itself, else any key holding
    "num" and "heads" / "layers" (FasterDecoding's ``medusa_num_heads``)."""
    exact = {"heads": "num_heads", "layers": "num_hidden_layers"}[what]
    keys = [exact] if exact in cfg else [k for k in cfg if "num" in k and what in k]
    return int(cfg[keys[0]]) if keys and isinstance(cfg[keys[0]], (int, float)) else None


@dataclass
class _Parsed:
    """A weights file's tensors by role: ``blocks[(head, layer)]`` -> {"weight", "bias"}, ``lms[head]`` the
    LM heads, ``finals[head]`` -> (layer, tensor) (FasterDecoding's LM head after the blocks), the layout."""

    blocks: dict
    lms: dict
    finals: dict
    layout: str


def _parse_weights(state: dict, wfile: Path) -> _Parsed:
    """Sort the tensors of ``wfile`` by their names (either layout, a ``medusa_heads.`` / ``medusa_head.``
    prefix dropped); refuses a ``token_map``, a name of neither layout, and a mix of both."""
    blocks, lms, finals, layouts = {}, {}, {}, set()
    for key, t in state.items():
        k = key.removeprefix("medusa_heads.").removeprefix("medusa_head.")
        if m := re.fullmatch(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)", k):
            layouts.add("vllm")
            blocks.setdefault((int(m[1]), int(m[2])), {})[m[3]] = t
        elif m := re.fullmatch(r"lm_heads\.(\d+)\.weight", k):
            layouts.add("vllm")
            lms[int(m[1])] = t
        elif m := re.fullmatch(r"(\d+)\.(\d+)\.linear\.(weight|bias)", k):
            layouts.add("fasterdecoding")
            blocks.setdefault((int(m[1]), int(m[2])), {})[m[3]] = t
        elif m := re.fullmatch(r"(\d+)\.(\d+)\.weight", k):
            layouts.add("fasterdecoding")
            finals[int(m[1])] = (int(m[2]), t)
        elif k == "token_map":
            raise ModelError(f"{wfile} holds a token_map (a truncated draft vocabulary): latticedraft's Medusa heads "
                             "predict over the whole vocabulary; import heads without truncation (decode's "
                             "--draft-vocab reduces the drafting vocabulary instead)")
        else:
            raise ModelError(f"{wfile} holds {key!r}, not a Medusa head weight (vLLM: blocks.I.layers.L.weight, "
                             "lm_heads.I.weight; FasterDecoding: medusa_head.I.L.linear.weight); pass a Medusa checkpoint")
    if len(layouts) != 1:
        raise ModelError(f"{wfile} holds " + ("no Medusa head weights" if not layouts else
                         "both vLLM's and FasterDecoding's weight names") + "; pass one Medusa checkpoint")
    return _Parsed(blocks, lms, finals, layouts.pop())


def _check_untruncated(cfg: dict, src: Path) -> None:
    """Refuse a config whose ``truncated_vocab_size`` differs from its ``vocab_size`` (a token_map)."""
    truncated, vocab = cfg.get("truncated_vocab_size"), cfg.get("vocab_size")
    if truncated is not None and vocab is not None and truncated != vocab:
        raise ModelError(f"{src / 'config.json'}: truncated_vocab_size {truncated} differs from vocab_size {vocab} "
                         "(a token_map draft vocabulary): latticedraft's Medusa heads predict over the whole vocabulary; "
                         "import heads without truncation (decode's --draft-vocab reduces the drafting vocabulary instead)")


def _head_count(p: _Parsed, cfg: dict, original: bool, wfile: Path, src: Path) -> tuple[int, int]:
    """``(n heads, L blocks per head)`` as the weights hold them (FasterDecoding's final layers become the
    LM heads in ``p.lms``), checked against what ``config.json`` states."""
    if p.layout == "fasterdecoding":
        for i, (j, t) in p.finals.items():
            p.lms[i] = t
            if any((i, l) not in p.blocks for l in range(j)) or (i, j) in p.blocks:
                raise ModelError(f"{wfile}: head {i}'s LM head is layer {j}, but its residual blocks are not layers "
                                 f"0..{j - 1}; pass an unmodified FasterDecoding checkpoint")
    n = 1 + max({i for i, _ in p.blocks} | (set() if original else set(p.lms)), default=-1)
    if original and not p.blocks:  # no blocks and one shared LM head: only the config tells the number of heads
        n = _config_count(cfg, "heads") or 0
    L = 1 + max([l for _, l in p.blocks], default=-1)
    if n < 1:
        raise ModelError(f"{wfile} ({p.layout} layout) holds no heads; pass a Medusa checkpoint")
    for what, stated, got in (("heads", _config_count(cfg, "heads"), n), ("layers", _config_count(cfg, "layers"), L)):
        if stated is not None and stated != got:
            raise ModelError(f"{src / 'config.json'} says {stated} {what} but {wfile} holds {got}; "
                             "the config and the weights are from different checkpoints")
    return n, L


def _check_complete(p: _Parsed, n: int, L: int, original: bool, where: str) -> set:
    """Refuse missing blocks or LM heads and blocks of which only some have a bias; returns the set
    of "has a bias" over the blocks (``{True}``, ``{False}`` or empty)."""
    missing = [f"block {i}.{l}" for i in range(n) for l in range(L) if "weight" not in p.blocks.get((i, l), {})]
    missing += [] if original else [f"LM head {i}" for i in range(n) if i not in p.lms]
    if original and 0 not in p.lms:
        missing.append("LM head 0 (original_lm_head)")
    if missing:
        raise ModelError(f"{where} lacks {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}; "
                         "pass a complete Medusa checkpoint")
    biased = {("bias" in p.blocks[i, l]) for i in range(n) for l in range(L)}
    if len(biased) > 1:
        raise ModelError(f"{where}: some residual blocks have a bias and some do not; pass a consistent Medusa checkpoint")
    return biased


def _check_shapes(p: _Parsed, n: int, L: int, original: bool, where: str) -> tuple[int, int]:
    """``(V, H)`` of LM head 0; refuses any block or LM head of another shape."""
    lm_first = p.lms[0]
    if lm_first.dim() != 2:
        raise ModelError(f"{where}: LM head 0 has shape {tuple(lm_first.shape)}, not [vocab, hidden]")
    V, H = lm_first.shape
    bad = [f"block {i}.{l} {q} has shape {tuple(t.shape)}" for i in range(n) for l in range(L)
           for q, t in p.blocks[i, l].items() if tuple(t.shape) != ((H, H) if q == "weight" else (H,))]
    bad += [] if original else [f"LM head {i} has shape {tuple(p.lms[i].shape)}" for i in range(n)
                                if tuple(p.lms[i].shape) != (V, H)]
    if bad:
        raise ModelError(f"{where}: LM head 0 is [{V}, {H}] but {bad[0]}; pass an unmodified Medusa checkpoint")
    return V, H


def read_checkpoint(src: str | Path) -> MedusaCheckpoint:
    """Read Medusa heads from ``src`` (vLLM's or FasterDecoding's layout, told apart by the weight names).

    Raises ``ModelError`` naming the file and the key for anything else: unknown weight names,
    missing or ragged heads, shapes that disagree, a truncated vocabulary."""
    src = Path(src)
    if not src.is_dir():
        raise InputError(f"Medusa checkpoint {src} is {'a file' if src.exists() else 'missing'}; "
                         "pass the directory holding config.json and the weights")
    cfg = _read_config(src)
    wfile, state = _read_weights(src)
    p = _parse_weights(state, wfile)
    _check_untruncated(cfg, src)
    original = bool(cfg.get("original_lm_head", False))
    n, L = _head_count(p, cfg, original, wfile, src)
    where = f"{wfile} ({p.layout} layout)"
    biased = _check_complete(p, n, L, original, where)
    V, H = _check_shapes(p, n, L, original, where)
    lm_first, blocks = p.lms[0], p.blocks
    w = (torch.stack([torch.stack([blocks[i, l]["weight"] for l in range(L)]) for i in range(n)]) if L
         else lm_first.new_zeros(n, 0, H, H))
    fc_bias = biased == {True} if L else bool(cfg.get("medusa_fc_bias", p.layout == "fasterdecoding"))
    if p.layout == "vllm" and L and fc_bias != bool(cfg.get("medusa_fc_bias", False)):
        raise ModelError(f"{where}: the residual blocks {'have' if fc_bias else 'lack'} biases but config.json "
                         f"{'does not set' if fc_bias else 'sets'} medusa_fc_bias (vLLM reads the blocks as "
                         f"{'unbiased' if fc_bias else 'biased'}); set medusa_fc_bias to {str(fc_bias).lower()} there")
    b = (torch.stack([torch.stack([blocks[i, l]["bias"] for l in range(L)]) for i in range(n)]) if L
         else lm_first.new_zeros(n, 0, H)) if fc_bias else None
    lm = None if original else torch.stack([p.lms[i] for i in range(n)])
    for key, size in (("hidden_size", H), ("vocab_size", V)):
        if key in cfg and cfg[key] != size:
            raise ModelError(f"{src / 'config.json'} says {key} {cfg[key]} but the weights in {wfile} have {size}; "
                             "the config and the weights are from different checkpoints")
    return MedusaCheckpoint(w=w, b=b, fc_bias=fc_bias, lm=lm, shared_lm=lm_first if original else None,
                            logit_scale=float(cfg.get("logit_scale", 1.0)), layout=p.layout, config=cfg,
                            dtype=lm_first.dtype)


@dataclass
class MedusaSummary:
    """What ``import_medusa`` / ``export_medusa`` did: Medusa heads (latticedraft heads - 1), blocks per head,
    "heads" (own LM heads) or "tied", the source layout, the dtype written, the output directory."""

    num_heads: int
    num_layers: int
    lm_head: str
    layout: str
    dtype: str
    out_dir: Path


def import_medusa(src: str | Path, base_dir: str | Path, out_dir: str | Path, force: bool = False) -> MedusaSummary:
    """Write the Medusa heads in ``src`` as a latticedraft head directory ``out_dir`` on the base in ``base_dir``.

    ``heads_config.json`` names the base relatively; ``heads.safetensors`` keeps the source's dtype,
    so ``export_medusa`` gives back the same tensors. An ``original_lm_head`` equal to the base's
    output embedding becomes ``lm_head: "tied"`` (any other is refused). The source's other config
    entries are kept (``medusa_config``) for the export. ``out_dir``: ``outputs.claim_dir``
    (``force`` replaces an earlier import only), checked before anything is read."""
    from latticedraft.gpu.models.blockwise import BlockwiseModel

    src, out_dir = Path(src), Path(out_dir)
    claim_dir(out_dir, MEDUSA_IMPORT, force=force, inputs={"SRC": src, "--base": base_dir})
    ck = read_checkpoint(src)
    base_dir = hf.check_model_dir(base_dir)
    base = hf.load_causal_lm(base_dir)
    H, V = int(base.config.hidden_size), hf.model_vocab_size(base)
    if (ck.hidden_size, ck.vocab_size) != (H, V):
        raise ModelError(f"the Medusa heads in {src} are for a base with hidden size {ck.hidden_size} and vocabulary "
                         f"{ck.vocab_size}, but {base_dir} has hidden size {H} and vocabulary {V}; "
                         f"import them onto the base they were trained for{_named_base(ck.config)}")
    lm_head = "heads"
    if ck.shared_lm is not None:
        emb = base.get_output_embeddings().weight.detach()
        if not torch.equal(emb.to(ck.shared_lm.dtype), ck.shared_lm):
            raise ModelError(_original_lm_head_mismatch(src, base_dir, ck, emb))
        lm_head = "tied"
    bm = BlockwiseModel.from_base(base, ck.num_heads + 1, "medusa", medusa_layers=ck.num_layers, medusa_lm_head=lm_head,
                                  medusa_fc_bias=ck.fc_bias, logit_scale=ck.logit_scale)
    with torch.no_grad():
        bm.heads.w.copy_(ck.w)
        if ck.b is not None:
            bm.heads.b.copy_(ck.b)
        if ck.lm is not None:
            bm.heads.lm.copy_(ck.lm)
    bm.heads.to(ck.dtype)
    kept = {k: v for k, v in ck.config.items() if k not in _SHAPE_KEYS and not _vllm_count_key(k)}
    meta = {"medusa_config": kept, "medusa_source": {"layout": ck.layout, "keys": sorted(ck.config)}}
    with atomic_dir(out_dir) as stage:
        bm.save_pretrained(stage, base_ref=os.path.relpath(base_dir.resolve(), out_dir.resolve()), extra=meta)
        _write_marker(stage / MARKER_MEDUSA_IMPORT, "import", layout=ck.layout, source=src.name,
                      medusa_heads=ck.num_heads)
        written = {p.name for p in stage.iterdir()}
    remove_stale(out_dir, MEDUSA_IMPORT, written)
    return MedusaSummary(ck.num_heads, ck.num_layers, lm_head, ck.layout, _dtype_name(ck.dtype), out_dir)


def _original_lm_head_mismatch(src: Path, base_dir: Path, ck: MedusaCheckpoint, emb: torch.Tensor) -> str:
    """The one line for a checkpoint whose shared LM head (``original_lm_head``) is not ``base_dir``'s."""
    own, theirs = ck.shared_lm.float(), emb.float()
    return (f"{src / 'config.json'} sets original_lm_head true (every Medusa head shares the LM head stored as "
            f"lm_heads.0.weight, norm {own.norm():.4g}), but {base_dir} has another LM head (its output embedding: "
            f"norm {theirs.norm():.4g}, largest difference {(own - theirs).abs().max():.3g}); import the heads onto "
            f"the base they were trained for{_named_base(ck.config)}")


def _write_marker(f: Path, verb: str, **info) -> None:
    f.write_text(json.dumps({"format": f"latticedraft-medusa-{verb}", "version": 1, **info}, indent=1) + "\n")


def _named_base(cfg: dict) -> str:
    name = cfg.get("base_model_name_or_path") or cfg.get("_name_or_path")
    return f" ({name}, as its config.json says)" if isinstance(name, str) and name else ""


def _vllm_count_key(k: str) -> bool:
    """Keys vLLM would read as num_heads / num_hidden_layers: never copied, or they would clash."""
    return "num" in k and ("heads" in k or "layers" in k)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def export_medusa(model_dir: str | Path, out_dir: str | Path, dtype: str | None = None,
                  force: bool = False) -> MedusaSummary:
    """Write the Medusa heads of head directory ``model_dir`` into ``out_dir`` in vLLM's layout
    (``config.json`` + ``model.safetensors``, and ``medusa_export.json`` that vLLM ignores), as
    ``dtype`` (default: the dtype they are stored in).

    Tied heads are written as ``original_lm_head`` with the base's output embedding as
    ``lm_heads.0.weight``. Heads of another kind (Stern, DynaMo) are refused: vLLM's Medusa
    layout cannot express them. ``out_dir``: ``outputs.claim_dir`` (``force`` replaces an earlier
    export only), checked before anything is read."""
    from safetensors.torch import save_file

    from latticedraft.gpu.models.blockwise import CONFIG_NAME, WEIGHTS_NAME, BlockwiseModel

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    claim_dir(out_dir, MEDUSA_EXPORT, force=force, inputs={"--model": model_dir})
    cfg_file = model_dir / CONFIG_NAME
    if cfg_file.is_file():
        try:
            kind = json.loads(cfg_file.read_text()).get("kind")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            kind = None  # from_pretrained names the problem
        if kind in ("stern", "dynamo"):
            what = {"stern": "Stern FFN heads", "dynamo": "DynaMo decoder-layer heads"}[kind]
            raise ModelError(f"{model_dir} holds {what}, which vLLM's Medusa layout cannot express; train Medusa heads "
                             "for this base with `latticedraft train heads --kind medusa` and export those")
    elif (model_dir / "config.json").is_file():
        raise ModelError(f"{model_dir} is a causal LM without heads; train Medusa heads for it with "
                         "`latticedraft train heads --kind medusa` and export those")
    bm = BlockwiseModel.from_pretrained(model_dir)
    stored = next(iter(hf.load_safetensors(model_dir / WEIGHTS_NAME).values()), None)
    out_dtype = hf.resolve_dtype(dtype) if dtype is not None else (stored.dtype if stored is not None else torch.float32)
    heads = bm.heads
    tensors = heads.head_state_dict()  # vLLM's names already
    if heads.lm is None:
        lm = bm.base.get_output_embeddings()
        if getattr(lm, "bias", None) is not None:
            raise ModelError(f"the base of {model_dir} has an output bias, which vLLM's original_lm_head cannot carry; "
                             "train Medusa heads with --medusa-lm-head heads and export those")
        tensors["lm_heads.0.weight"] = lm.weight
    tensors = {k: v.detach().to(out_dtype).contiguous().cpu() for k, v in tensors.items()}
    src = json.loads(cfg_file.read_text())
    source_keys = set(src.get("medusa_source", {}).get("keys", []))
    config = dict(src.get("medusa_config", {}))
    config.update(model_type="medusa", hidden_size=int(bm.base.config.hidden_size),
                  vocab_size=hf.model_vocab_size(bm.base), num_heads=heads.num_extra,
                  num_hidden_layers=heads.num_layers)
    for key, value in (("medusa_fc_bias", heads.fc_bias), ("original_lm_head", heads.lm is None),
                       ("logit_scale", heads.logit_scale)):
        if value != _OPTIONAL[key] or key in source_keys:
            config[key] = value
    if "truncated_vocab_size" in source_keys:
        config["truncated_vocab_size"] = config["vocab_size"]
    if not source_keys:
        config.update(architectures=["MedusaModel"], torch_dtype=_dtype_name(out_dtype))
    for key in ("torch_dtype", "dtype"):
        if key in config:
            config[key] = _dtype_name(out_dtype)
    with atomic_dir(out_dir) as stage:
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        (stage / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _write_marker(stage / MARKER_MEDUSA_EXPORT, "export", medusa_heads=heads.num_extra,
                      dtype=_dtype_name(out_dtype))
        written = {p.name for p in stage.iterdir()}
    remove_stale(out_dir, MEDUSA_EXPORT, written)
    return MedusaSummary(heads.num_extra, heads.num_layers, heads.lm_head, "vllm", _dtype_name(out_dtype), out_dir)
