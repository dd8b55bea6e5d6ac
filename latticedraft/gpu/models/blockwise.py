"""``BlockwiseModel``: any HF causal LM plus ``h - 1`` extra heads predicting tokens t+2..t+h.

Head 1 is the base model's own LM head, untouched: ``out.logits`` is bit-identical to
``base(...).logits``, so verification is against the unmodified base model and lossless decoding
reproduces its greedy output. One forward runs the trunk once and returns the base logits at
every position (for verification) and, with ``heads=True``, all heads' logits (for drafting).

Example::

    base = AutoModelForCausalLM.from_pretrained("data/base")
    bm = BlockwiseModel.from_base(base, num_heads=4, kind="stern")
    out = bm(ids)                       # ids int64[b, s]
    out.logits                          # [b, s, V] == base(ids).logits
    out.head_logits                     # [b, s, 4, V]; [..., 0, :] is out.logits
    bm.save_pretrained("heads/")        # heads_config.json (names the base dir) + heads.safetensors
    bm2 = BlockwiseModel.from_pretrained("heads/")

Head kinds (``heads.py``): ``stern`` (FFN heads, tied unembedding), ``medusa`` (residual SiLU
blocks, own or tied LM heads; vLLM's layout, ``medusa_io.py``) and ``dynamo`` (decoder layers).
Stern and Medusa heads are *position-wise* (``position_wise``): a function of the final hidden
state at one position, so ``draft_logits(hidden, count, columns)`` computes them anywhere later.

KV caching (``cache=``, transformers' name): for position-wise kinds ``cache`` is the base model's own
``Cache``. For ``kind="dynamo"`` each extra head is a decoder layer with its own KV cache; ``cache`` is
then a ``BlockwiseCache(base=..., heads=[...])``. Whenever
``use_cache`` is true the dynamo head layers run (even with ``heads=False``) so that their caches
stay aligned with the base's; ``BlockwiseCache.crop`` / ``caches()`` apply edits to all of them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from latticedraft.atomic import atomic_file, write_atomic
from latticedraft.errors import InputError, ModelError
from latticedraft.gpu.models import hf
from latticedraft.gpu.models.heads import DynamoHeads, MedusaHeads, SternHeads, check_weight_transfer, scale_grad

CONFIG_NAME = "heads_config.json"
WEIGHTS_NAME = "heads.safetensors"
KINDS = ("stern", "dynamo", "medusa")
POSITION_WISE = ("stern", "medusa")


@dataclass
class BlockwiseOutput:
    """One forward's results (b = batch, s = new positions, h = heads, V = vocab, H = hidden).

    logits: [b, s, V] the base model's own logits, bit-identical to ``base(...)``.
    head_logits: [b, s, h, V], ``head_logits[..., 0, :]`` is ``logits``; None if ``heads=False``.
    hidden: [b, s, H] final hidden state (after the final norm).
    cache: what to pass back next call (the base ``Cache``; for dynamo a ``BlockwiseCache``).
    head_hidden: [b, s, h-1, H] pre-unembedding states of heads 2..h, or None (computed lazily).
    """

    logits: torch.Tensor
    head_logits: torch.Tensor | None
    hidden: torch.Tensor
    cache: object
    head_hidden: torch.Tensor | None = None

    @property
    def past_key_values(self):
        """``cache`` under the name transformers < 5.24 reads (``hf.output_cache``)."""
        return self.cache


class BlockwiseCache:
    """KV caches of a dynamo ``BlockwiseModel``: the base's and one per extra head layer.

    All caches always hold the same positions. Edit them together: ``crop(-n)`` removes the last
    ``n`` positions from every cache (HF's convention), ``caches()`` lists ``[base, *heads]`` for
    other edits (e.g. gathering accepted tree positions).
    """

    def __init__(self, base, heads: list):
        self.base = base
        self.heads = list(heads)

    def caches(self) -> list:
        return [self.base, *self.heads]

    @property
    def layers(self) -> list:
        """Every cache layer, base first then each head's: code that edits ``cache.layers[i].keys/values``
        uniformly (gathering accepted slots, cropping) edits all caches alike."""
        return [layer for c in self.caches() for layer in c.layers]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.base.get_seq_length(layer_idx)

    def crop(self, tokens_to_remove: int) -> None:
        for c in self.caches():
            c.crop(tokens_to_remove)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for c in self.caches():
            c.batch_select_indices(indices)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        for c in self.caches():
            c.reorder_cache(beam_idx)


def _check_num_heads(num_heads: int) -> None:
    if not isinstance(num_heads, int) or num_heads < 2:
        raise InputError(
            f"--heads {num_heads}: a blockwise model needs at least 2 heads (head 1 is the base model's own); use 2 or more"
        )


class BlockwiseModel(nn.Module):
    """A base causal LM with ``num_heads`` heads (head 1 = the base's LM head). See the module docstring."""

    def __init__(self, base: nn.Module, num_heads: int, kind: str, heads: nn.Module, base_ref: str | None = None):
        super().__init__()
        self.base = base
        self.num_heads = num_heads
        self.kind = kind
        self.heads = heads
        self.base_ref = base_ref  # directory the base was loaded from, if any
        self._columns = None  # (columns, weight versions, projection weights): ``_column_weights``'s cache

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_base(cls, base: nn.Module, num_heads: int, kind: str = "stern", seed: int = 0,
                  ffn_dim: int | None = None, act: str = "gelu", medusa_layers: int = 1,
                  medusa_lm_head: str = "heads", medusa_fc_bias: bool = True,
                  logit_scale: float = 1.0, token_input: bool = False) -> "BlockwiseModel":
        """New heads on ``base`` (seeded init; Stern and Medusa heads start as copies of head 1's
        prediction, DynaMo heads as copies of the final layer). ``ffn_dim`` (Stern) defaults to
        4 × hidden size; ``medusa_*`` and ``logit_scale`` shape Medusa heads (see ``MedusaHeads``);
        ``token_input``: Stern heads that also read the base's greedy next token (``SternHeads``)."""
        _check_num_heads(num_heads)
        if kind not in KINDS:
            raise InputError(f"--kind {kind!r} is unknown; use stern, medusa or dynamo")
        if token_input and kind != "stern":
            raise InputError("--token-input is a Stern head option; drop it or use --kind stern")
        if base.get_output_embeddings() is None:
            raise ModelError(f"{type(base).__name__} has no output embedding; pass a *ForCausalLM model")
        hidden = int(base.config.hidden_size)
        p = next(base.parameters())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if kind == "stern":
                heads = SternHeads(hidden, num_heads - 1, ffn_dim or 4 * hidden, act, token_input).to(
                    device=p.device, dtype=p.dtype)
                heads.attach(base)
            elif kind == "medusa":
                emb = base.get_output_embeddings().weight if medusa_lm_head == "heads" else None
                heads = MedusaHeads(hidden, num_heads - 1, medusa_layers, medusa_lm_head, medusa_fc_bias, emb,
                                    logit_scale).to(device=p.device, dtype=p.dtype)
            else:
                heads = DynamoHeads(base, num_heads - 1)
        if kind == "dynamo":
            check_weight_transfer(base, heads)
        bm = cls(base, num_heads, kind, heads, base_ref=_dir_of(base))
        return bm.train(base.training)

    @classmethod
    def from_pretrained(cls, path: str | Path, base: nn.Module | None = None, device=None, dtype=None) -> "BlockwiseModel":
        """Load heads saved by ``save_pretrained``; the base comes from ``base`` or the directory named in the config.

        ``dtype`` (default float32) and ``device`` apply to the base when it is loaded here; the
        heads follow the base's dtype and device.
        """
        path = Path(path)
        cfg_file = path / CONFIG_NAME
        if path.exists() and not path.is_dir():
            raise ModelError(f"head checkpoint {path} is a file, not a directory; "
                             "pass the directory save_pretrained wrote")
        if not cfg_file.is_file():
            raise ModelError(f"{path} has no {CONFIG_NAME}; it is not a head checkpoint (train one with `latticedraft train heads`)")
        try:
            cfg = json.loads(cfg_file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelError(f"{cfg_file} is not valid JSON ({e}); re-save the heads") from e
        need = ("base", "hidden_size", "vocab_size", "num_heads", "kind")
        missing = [k for k in need if k not in cfg] if isinstance(cfg, dict) else list(need)
        if missing:
            raise ModelError(f"{cfg_file} lacks {', '.join(missing)}; re-save the heads")
        base_dir = None
        if base is None:
            base_dir = (path / cfg["base"]).resolve()
            base = hf.load_causal_lm(base_dir, device=device, dtype=dtype)
        hidden, vocab = int(base.config.hidden_size), hf.model_vocab_size(base)
        if (hidden, vocab) != (cfg["hidden_size"], cfg["vocab_size"]):
            raise ModelError(
                f"head checkpoint {path} was trained for a base with hidden size {cfg['hidden_size']} and vocabulary "
                f"{cfg['vocab_size']}, but this base has hidden size {hidden} and vocabulary {vocab}; "
                "load it onto the base it was trained with"
            )
        if cfg.get("base_model_type") and cfg["base_model_type"] != base.config.model_type:
            raise ModelError(
                f"head checkpoint {path} was trained on a {cfg['base_model_type']} base, not {base.config.model_type}; "
                "load it onto the base it was trained with"
            )
        bm = cls.from_base(base, int(cfg["num_heads"]), cfg["kind"], ffn_dim=cfg.get("ffn_dim"), act=cfg.get("act", "gelu"),
                           medusa_layers=cfg.get("num_layers", 1), medusa_lm_head=cfg.get("lm_head", "heads"),
                           medusa_fc_bias=cfg.get("fc_bias", True), logit_scale=cfg.get("logit_scale", 1.0),
                           token_input=bool(cfg.get("token_input", False)))
        if base_dir is not None:
            bm.base_ref = str(base_dir)
        wfile = path / WEIGHTS_NAME
        if not wfile.is_file():
            raise ModelError(f"head checkpoint {path} has no {WEIGHTS_NAME}; re-save the heads")
        state = hf.load_safetensors(wfile)
        own = bm.heads.head_state_dict()
        if set(state) != set(own) or any(state[k].shape != own[k].shape for k in own):
            raise ModelError(f"{wfile} does not hold the weights of {cfg['num_heads']} {cfg['kind']} heads; re-save the heads")
        with torch.no_grad():
            for k, v in own.items():
                v.copy_(state[k].to(dtype=v.dtype, device=v.device))
        return bm.eval()

    def save_pretrained(self, path: str | Path, base_ref: str | None = None, bundle_base: bool | None = None,
                        extra: dict | None = None) -> None:
        """Write ``heads_config.json`` and ``heads.safetensors`` (heads 2..h, their current dtype) into ``path``.

        ``extra``: more entries for ``heads_config.json`` (e.g. what ``import medusa`` keeps of the source config).
        The config names the base: ``base_ref`` if given (relative to ``path``), else the directory
        the base was loaded from (as a relative path); if there is none, or ``bundle_base=True``,
        the base itself is saved into ``path/base``.
        """
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if bundle_base or (bundle_base is None and base_ref is None and self.base_ref is None):
            self.base.save_pretrained(path / "base")
            base_ref = "base"
        elif base_ref is None:
            base_ref = os.path.relpath(self.base_ref, path.resolve())
        cfg = {
            "format": "latticedraft-blockwise", "version": 1, "kind": self.kind, "num_heads": self.num_heads,
            "hidden_size": int(self.base.config.hidden_size), "vocab_size": hf.model_vocab_size(self.base),
            "base_model_type": self.base.config.model_type, "base": base_ref,
        }
        if self.kind == "stern":
            cfg.update(ffn_dim=self.heads.ffn, act=self.heads.act_name)
            if self.heads.token_input:
                cfg["token_input"] = True
        elif self.kind == "medusa":
            cfg.update(num_layers=self.heads.num_layers, lm_head=self.heads.lm_head, fc_bias=self.heads.fc_bias,
                       logit_scale=self.heads.logit_scale)
        if extra:
            cfg.update(extra)
        state = {k: v.detach().contiguous().cpu() for k, v in self.heads.head_state_dict().items()}
        with atomic_file(path / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        write_atomic(path / CONFIG_NAME, json.dumps(cfg, indent=1) + "\n")

    # -- computation -------------------------------------------------------------------------

    def new_cache(self):
        """An empty cache to pass as ``cache``: a ``DynamicCache`` (stern) or a ``BlockwiseCache`` (dynamo)."""
        from transformers import DynamicCache

        base = DynamicCache(config=self.base.config)
        if self.position_wise:
            return base
        return BlockwiseCache(base, [DynamicCache(config=b.config) for b in self.heads.blocks])

    @property
    def position_wise(self) -> bool:
        """Whether the extra heads are a function of the final hidden state at one position
        (Stern, Medusa), so that ``draft_logits`` computes them from stored hidden states."""
        return self.kind in POSITION_WISE

    @property
    def token_input(self) -> bool:
        """Whether the extra heads also read the base's greedy next token (``SternHeads``)."""
        return bool(getattr(self.heads, "token_input", False))

    def head_parameters(self):
        """The parameters of heads 2..h (what head training updates when the base is frozen)."""
        if self.position_wise:
            return list(self.heads.parameters())
        return list(self.heads.head_parameters())

    def unembed(self, states: torch.Tensor, grad_scale: float = 1.0) -> torch.Tensor:
        """``[..., H] -> [..., V]`` with the base model's (tied) output embedding.

        ``grad_scale`` multiplies the gradient reaching the embedding's weights through this call
        (training with DynaMo's LR_MB); at 1 this is the base's own module call."""
        lm = self.base.get_output_embeddings()
        if grad_scale == 1.0:
            return lm(states)
        bias = getattr(lm, "bias", None)
        return torch.nn.functional.linear(states, scale_grad(lm.weight, grad_scale),
                                          None if bias is None else scale_grad(bias, grad_scale))

    def project_heads(self, states: torch.Tensor, first: int = 0, columns: torch.Tensor | None = None,
                      grad_scale: float = 1.0) -> torch.Tensor:
        """Logits of extra heads ``first .. first+n-1`` (0-based: 0 is head 2) from their states before
        the LM head, ``states [..., n, H] -> [..., n, V']``: the base's output embedding (Stern, DynaMo,
        tied Medusa) or each head's own LM head. ``columns`` (int64[V'] token ids) projects onto those
        vocabulary entries only (the projection weights are gathered once per ``columns`` tensor);
        ``grad_scale`` as in ``unembed`` (the shared output embedding only)."""
        n, H = states.shape[-2], states.shape[-1]
        own = self.heads.lm_weights(first, n) if self.kind == "medusa" else None  # [n, V, H] or None
        if own is None:
            if columns is None:
                logits = self.unembed(states, grad_scale)
            else:
                w, b = self._column_weights(columns)
                logits = torch.nn.functional.linear(states, w, b)
        else:
            w = own if columns is None else self._column_weights(columns)[0][first : first + n]
            x = states.reshape(-1, n, H).transpose(0, 1)  # [n, M, H]
            logits = torch.bmm(x, w.transpose(1, 2)).transpose(0, 1).reshape(*states.shape[:-1], -1)
        scale = getattr(self.heads, "logit_scale", 1.0)
        return logits if scale == 1.0 else logits * scale

    def draft_logits(self, hidden: torch.Tensor, count: int, columns: torch.Tensor | None = None,
                     next_tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of extra heads 1..count (heads 2..count+1) at final hidden states ``hidden [m, H]``:
        ``[m, count, V']``, over the token ids ``columns`` (int64[V']) when given, else the full
        vocabulary. Position-wise kinds only (``position_wise``): what a verifier calls at the
        accepted node of each row to draft the next step. ``next_tokens`` int64[m]: the base's
        greedy token after each state, for token-input heads (None: projected here)."""
        if not self.position_wise:
            raise ModelError(f"{self.kind} heads read their own KV caches; draft_logits needs position-wise "
                             "(stern or medusa) heads")
        if count <= 0:
            cols = hf.model_vocab_size(self.base) if columns is None else len(columns)
            return hidden.new_zeros(*hidden.shape[:-1], 0, cols)
        states = self.heads(hidden, count, next_tokens=next_tokens) if self.token_input else self.heads(hidden, count)
        return self.project_heads(states, 0, columns)

    def _column_weights(self, columns: torch.Tensor):
        """(weight, bias) of the projection onto ``columns``: ``[V', H]`` and ``[V']`` or None for the
        output embedding, ``[n, V', H]`` and None for own Medusa LM heads. Cached while ``columns`` is
        the same tensor and no weight changed (training updates the weights in place)."""
        lm = self.base.get_output_embeddings()
        src = self.heads.lm if self.kind == "medusa" and self.heads.lm is not None else lm.weight
        bias = None if src is not lm.weight else getattr(lm, "bias", None)
        version = (src._version, None if bias is None else bias._version)
        if self._columns is None or self._columns[0] is not columns or self._columns[1] != version:
            cols = columns.to(src.device)
            w = src.detach().index_select(src.dim() - 2, cols).contiguous()
            b = None if bias is None else bias.detach().index_select(0, cols).contiguous()
            self._columns = (columns, version, (w, b))
        return self._columns[2]

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None,
                use_cache: bool = False, heads: bool = True, **base_kwargs) -> BlockwiseOutput:
        """One trunk pass. ``input_ids`` int64[b, s]; ``attention_mask`` 2-D [b, total_len] (padding) or a
        4-D additive/bool mask [b, 1, s, total_len] (tree attention), passed through unchanged to the base
        and to dynamo head layers; ``position_ids`` [b, s] likewise. ``cache`` may come as
        ``past_key_values`` (``hf.cache_keyword``: what callers pass any model under transformers < 5.24)."""
        cache = base_kwargs.pop("past_key_values", cache)
        base_cache, head_caches = cache, None
        if isinstance(cache, BlockwiseCache):
            base_cache, head_caches = cache.base, cache.heads
        elif self.kind == "dynamo" and cache is not None and cache.get_seq_length() > 0:
            raise InputError("a dynamo BlockwiseModel needs the BlockwiseCache it returned as its cache, not a bare base cache")
        if self.kind == "dynamo" and use_cache and base_cache is None:
            from transformers import DynamicCache

            base_cache = DynamicCache(config=self.base.config)
        out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                        use_cache=use_cache, output_hidden_states=True, **hf.cache_arg(base_cache), **base_kwargs)
        hidden = out.hidden_states[-1]
        head_hidden, out_cache = None, hf.output_cache(out)
        if self.kind == "dynamo":
            if heads or use_cache:
                head_hidden, head_caches = self.heads(out.hidden_states[-2], attention_mask, position_ids,
                                                      head_caches, use_cache)
            if use_cache:
                out_cache = BlockwiseCache(hf.output_cache(out), head_caches)
        elif heads:
            head_hidden = (self.heads(hidden, next_tokens=out.logits.argmax(-1)) if self.token_input else self.heads(hidden))
        head_logits = None
        if heads:
            head_logits = torch.cat([out.logits.unsqueeze(-2), self.project_heads(head_hidden)], dim=-2)
        return BlockwiseOutput(logits=out.logits, head_logits=head_logits, hidden=hidden,
                               cache=out_cache, head_hidden=head_hidden)

    def head_logits_from(self, out: BlockwiseOutput, positions: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """All heads' logits at ``positions`` (indices into the s positions of ``out``): [b, len(positions), h, V].

        Cheap for position-wise heads (computed here from ``out.hidden``); for dynamo the head states
        come from the forward (run whenever ``use_cache`` or ``heads`` was true).
        """
        pos = torch.as_tensor(positions, dtype=torch.long, device=out.logits.device).reshape(-1)
        if self.position_wise:
            if out.head_hidden is not None:
                states = out.head_hidden[:, pos]
            elif self.token_input:
                states = self.heads(out.hidden[:, pos], next_tokens=out.logits[:, pos].argmax(-1))
            else:
                states = self.heads(out.hidden[:, pos])
        else:
            if out.head_hidden is None:
                raise InputError("this dynamo forward ran without heads or cache; call it with heads=True or use_cache=True")
            states = out.head_hidden[:, pos]
        return torch.cat([out.logits[:, pos].unsqueeze(-2), self.project_heads(states)], dim=-2)


def _dir_of(base: nn.Module) -> str | None:
    name = getattr(base, "name_or_path", None) or getattr(base.config, "_name_or_path", None)
    if name and (Path(name) / "config.json").is_file():
        return str(Path(name).resolve())
    return None
