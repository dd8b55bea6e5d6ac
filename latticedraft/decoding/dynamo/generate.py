"""DynaMo generation (``--method dynamo``): every row samples 1..n tokens per model call from its
heads (``sampler.step_distribution``), all rows of a batch in each call. APPROXIMATE sampling.

Rows emit different numbers of tokens per call; with ``use_cache`` each call feeds every row's new
tokens padded to the step's longest (pads are masked out and stay in the KV cache as holes,
positions count real tokens only); without it each call recomputes the whole left-padded batch.
The row bookkeeping (EOS, budget, finished rows, results) is ``rows.Rows``: a row's calls are its
steps; ``accepted_drafts[k]`` is the number of tokens step k sampled beyond the first (before the
budget or EOS cut it), ``tokens_per_call`` what it emitted.

Randomness: row ``r`` of a run with ``seed`` draws from ``numpy.random.default_rng([seed, r])``,
one uniform per step, so results do not depend on the other rows of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from latticedraft.decoding.dynamo.config import DynamoConfig
from latticedraft.decoding.dynamo.sampler import sample_from, step_distribution
from latticedraft.decoding.rows import Rows
from latticedraft.decoding.runs.prompt_length import checked_prompts
from latticedraft.errors import InputError, ModelError

if TYPE_CHECKING:
    from latticedraft.lm.cooccurrence import CooccurrenceStats


def model_heads(model) -> int:
    """How many heads the model has (``BlockwiseModel.num_heads``)."""
    h = getattr(model, "num_heads", None)
    if h is None:
        raise ModelError("the model has no multi-token heads (no num_heads); --method dynamo needs a DynaMo-headed "
                         "model (`latticedraft train heads --kind dynamo`, default data/heads-dynamo)")
    return int(h)


def check_model(model, config: DynamoConfig, where: str = "the model") -> None:
    """A DynaMo-headed model with at least 2 heads and as many as ``config`` samples per call."""
    h = model_heads(model)
    if getattr(model, "kind", "dynamo") != "dynamo" or h < 2:
        raise ModelError(f"{where} has {h} {getattr(model, 'kind', '')} head(s); --method dynamo needs a DynaMo-headed "
                         "model (`latticedraft train heads --kind dynamo`, default data/heads-dynamo)")
    config.validate(vocab_size=vocab_size(model), num_heads=h)


@dataclass
class _Sampler:
    """What a step needs to sample every live row: the row book (``Rows``), each row's generator, the
    config, the co-occurrence table and the most tokens a step may keep (``n_max``)."""

    book: Rows
    rngs: list
    config: DynamoConfig
    cooc: CooccurrenceStats | None
    n_max: int

    def step(self, logits: np.ndarray, live: list[int]) -> tuple[list, list[list[int]]]:
        """One DynaMo step for the live rows (head logits [b, n, V]): ``(whether each row is done, the
        tokens each row keeps)``."""
        book, done, kept = self.book, [], []
        for j, i in enumerate(live):
            dist = step_distribution(logits[j], book.history(i), self.config, self.cooc, n_max=self.n_max)
            toks = sample_from(dist, self.rngs[i]).tolist()
            before = len(book.out[i])
            book.step(i, len(toks) - 1, 1, 1)
            done.append(book.emit(i, toks))
            kept.append(book.out[i][before:])
        return done, kept


def _left_pad(seqs, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``seqs`` left-padded to the longest: ids int64[b, L] and the attention mask [b, L]."""
    L = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), L), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, x in enumerate(seqs):
        ids[i, L - len(x):] = torch.as_tensor(x, dtype=torch.long)
        mask[i, L - len(x):] = 1
    return ids, mask


def _right_pad(new: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's new tokens right-padded to the step's longest: ids int64[b, m] and their mask [b, m]."""
    m = max(len(t) for t in new)
    ids = torch.full((len(new), m), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(new), m), dtype=torch.long)
    for j, t in enumerate(new):
        ids[j, : len(t)] = torch.as_tensor(t, dtype=torch.long)
        mask[j, : len(t)] = 1
    return ids, mask


def _uncached(model, s: _Sampler, pad_token_id: int, device) -> None:
    """Every step recomputes the whole left-padded batch of live rows (no KV cache)."""
    book = s.book
    while book.live:
        live = list(book.live)
        ids, mask = _left_pad([book.history(i) for i in live], pad_token_id)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device),
                    heads=True)
        done, _ = s.step(_as_numpy(out.head_logits[:, -1, :s.n_max, :]), live)
        book.finish(done)


def _cached(model, s: _Sampler, prompts, pad_token_id: int, device) -> None:
    """The prompts' prefill, then each step feeds every live row's new tokens (right-padded; the pads
    stay in the KV cache as masked holes, positions count real tokens only)."""
    book = s.book
    ids, mask = _left_pad(prompts, pad_token_id)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    mask, nxt = mask.to(device), mask.sum(-1).to(device)  # nxt: next position id per row
    out = model(input_ids=ids.to(device), attention_mask=mask, position_ids=pos.to(device), use_cache=True, heads=True)
    cache, at = out.cache, torch.full((len(prompts),), ids.shape[1] - 1, dtype=torch.long)
    while True:
        live = list(book.live)
        hl = out.head_logits[torch.arange(len(live)), at.to(device)][:, :s.n_max]  # [b, n, V]
        done, new = s.step(_as_numpy(hl), live)
        keep = book.finish(done)
        if not keep:
            break
        if len(keep) < len(live):
            sel = torch.tensor(keep, dtype=torch.long, device=device)
            cache.batch_select_indices(sel)
            mask, nxt, new = mask[sel], nxt[sel], [new[j] for j in keep]
        step_ids, step_mask = _right_pad(new, pad_token_id)
        m = step_ids.shape[1]
        step_mask = step_mask.to(device)
        step_pos = nxt[:, None] + torch.arange(m, device=device)[None, :]
        mask = torch.cat([mask, step_mask], dim=1)
        nxt = nxt + step_mask.sum(-1)
        at = torch.tensor([len(t) - 1 for t in new], dtype=torch.long)
        out = model(input_ids=step_ids.to(device), attention_mask=mask, position_ids=step_pos,
                    cache=cache, use_cache=True, heads=True)
        cache = out.cache


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], config: DynamoConfig | None = None, cooc=None,
             max_new_tokens: int = 64, seed: int = 0, eos_token_id=None, pad_token_id: int = 0,
             tokenizer_fingerprint: str | None = None, use_cache: bool = True, first_row: int = 0,
             rows: list | None = None, on_tokens=None):
    """Sample continuations of ``prompts`` (token-id sequences) with DynaMo; a ``DecodeResult``.

    ``model``: a DynaMo ``BlockwiseModel`` (``forward(input_ids, attention_mask, position_ids,
    cache, use_cache, heads=True)`` -> ``head_logits [b, s, h, V]``). Rows stop at
    ``eos_token_id`` (kept) or after ``max_new_tokens`` and leave the batch. Seeds: row j draws
    from ``default_rng([seed, rows[j]])`` (default rows: first_row + j)."""
    config = config or DynamoConfig()
    check_model(model, config)
    h = model_heads(model)
    V = vocab_size(model)
    n_max = config.n_for(h)
    if config.cooccurrence and config.alpha_c > 0:
        if cooc is None:
            raise InputError("co-occurrence masking is on but no table was given; pass --cooccurrence PATH or --no-cooccurrence")
        cooc.check(vocab_size=V, fingerprint=tokenizer_fingerprint)
    prompts = checked_prompts(model, prompts, max_new_tokens)
    book = Rows(prompts, max_new_tokens, eos_token_id, on_tokens)
    ids_of = list(range(first_row, first_row + len(prompts))) if rows is None else list(rows)
    s = _Sampler(book, [np.random.default_rng([int(seed), int(r)]) for r in ids_of], config, cooc, n_max)
    device = next(model.parameters()).device
    if not use_cache:
        _uncached(model, s, pad_token_id, device)
        return book.result("dynamo", f"dynamo n<={n_max}, no cache", {})
    _cached(model, s, prompts, pad_token_id, device)
    return book.result("dynamo", f"dynamo n<={n_max}", {})


def vocab_size(model) -> int:
    for obj in (getattr(model, "base", None), model):
        cfg = getattr(obj, "config", None)
        if cfg is not None and getattr(cfg, "vocab_size", None):
            return int(cfg.vocab_size)
    raise ModelError("cannot tell the model's vocabulary size (no config.vocab_size)")


def _as_numpy(x) -> np.ndarray:
    return x.detach().float().cpu().numpy()

