"""The base's own text makers, the ``gpu.train.continuations.BaseDecoder`` implementations:
``LoopDecoder``, latticedraft's decode loop, which the training commands hand to ``train heads
--self-distill`` and ``train draft-model`` (``gpu/`` knows no algorithm, so the loop comes from
here), and ``PlainDecoder``, the base's forward in a plain left-padded batch, for a GPU where the
loop's per-step host work, not the weights, sets the pace (``scripts/own_text.py --engine plain``).

    >>> cfg = DistillConfig(decoder=LoopDecoder)                        # doctest: +SKIP
    >>> d = LoopDecoder(base_dir, base_dir / "tokenizer.json")          # doctest: +SKIP
    >>> d([np.array([5, 9, 2])], 4, None, 0, 0).shape                   # doctest: +SKIP
    (1, 4)                                                              # greedy, int64
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from latticedraft.gpu.train.continuations import ChatTurns


class _TextMaker:
    """What both text makers share: the base in ``base_dir`` (tokenizer at ``tokenizer_path``,
    None: beside the base) on ``device``, opened at the first decode (``_open`` sets ``_ends``),
    ``end_ids()`` and ``chat()``."""

    def __init__(self, base_dir, tokenizer_path=None, device=None):
        self.base_dir, self.tokenizer_path, self.device = Path(base_dir), tokenizer_path, device
        self._ends: list[int] = []
        self._chat: ChatTurns | None = None

    def _open(self):
        raise NotImplementedError

    def end_ids(self) -> Sequence[int]:
        """The ids that end a sequence, as ``generate`` takes them (``loaders.end_ids``)."""
        self._open()
        return self._ends

    def chat(self) -> ChatTurns:
        """The base's chat template as ``ChatTurns`` (loaded once; refused in one line naming
        ``--distill-chat`` without one). Loads the tokenizer, not the model."""
        if self._chat is None:
            from latticedraft.decoding.runs.chat import ChatTemplate

            t = ChatTemplate.load(self.base_dir, "--distill-chat")
            self._chat = ChatTurns(header=t.user_prefix_ids(),
                                   render=lambda q: t.ids([{"role": "user", "content": q}]),
                                   text=lambda ids: t.tokenizer.decode(list(ids), skip_special_tokens=True).strip())
        return self._chat


class LoopDecoder(_TextMaker):
    """The base in ``base_dir`` (tokenizer at ``tokenizer_path``, None: beside the base) continuing
    prompts with latticedraft's own loop: ``bpd`` with no drafter, so each row is what ``latticedraft
    decode --drafter none`` writes. The ``Session`` is opened at the first decode (a run the cache
    serves loads no model); end-of-text stops no row."""

    engine = "loop"  # the continuation cache's key names the engine where it is not this one
    _session = None

    def _open(self):
        if self._session is None:
            from latticedraft.decoding.runs.session import Session

            s = Session(self.base_dir, tokenizer_path=self.tokenizer_path, device=self.device)
            self._ends = list(s.eos or [])
            s.eos = None  # every row runs to new_tokens (the base continues past end-of-text)
            self._session = s
        return self._session

    def __call__(self, prompts: list[np.ndarray], new_tokens: int, temperature: float | None, seed: int,
                 first_row: int) -> np.ndarray:
        """int64[len(prompts), new_tokens]: ``temperature`` None greedy, else sampled (top-k and top-p
        off), row r seeded with ``[seed, first_row + r]``."""
        from latticedraft.decoding.accept.sampling import SamplingOptions
        from latticedraft.decoding.methods.bpd import DrafterSpec

        sampling = None if temperature is None else SamplingOptions(temperature=temperature, top_k=0, seed=seed)
        res = self._open().decode(prompts, "bpd", DrafterSpec("none"), max_new_tokens=new_tokens,
                                  batch_size=len(prompts), sampling=sampling, first_row=first_row)
        return np.stack([np.asarray(s.tokens, dtype=np.int64) for s in res.sequences])


class PlainDecoder(_TextMaker):
    """The base in ``base_dir`` continuing prompts with its own forward over one left-padded batch
    (padding masked, positions counted from each row's first token, a KV cache), greedy or sampled
    (top-k and top-p off): the same text as ``LoopDecoder`` up to the rounding that padding and the
    batch's kernels bring, at a GPU's pace (``LoopDecoder`` does host work per step and row). A
    sampled batch draws from one generator seeded with ``[seed, first_row]``, so a sampled row's
    text depends on the batching here. The model is loaded at the first decode; end-of-text stops
    no row."""

    engine = "plain"
    _model = None

    def _open(self):
        if self._model is None:
            from latticedraft.decoding.runs import loaders
            from latticedraft.gpu.models.hf import load_causal_lm
            from latticedraft.lm.tokenizer import load_tokenizer

            self._model = load_causal_lm(self.base_dir, device=self.device)
            tok = load_tokenizer(self.tokenizer_path or self.base_dir / "tokenizer.json")
            self._ends = list(loaders.end_ids(self._model, tok) or [])
        return self._model

    def __call__(self, prompts: list[np.ndarray], new_tokens: int, temperature: float | None, seed: int,
                 first_row: int) -> np.ndarray:
        """int64[len(prompts), new_tokens]: ``temperature`` None greedy (the lowest id of a tie),
        else sampled from the softmax at ``temperature``."""
        import torch

        from latticedraft.gpu.models.hf import cache_arg, output_cache

        model = self._open()
        dev = next(model.parameters()).device
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        gen = None
        if temperature is not None:
            gen = torch.Generator(device=dev)
            gen.manual_seed(int(np.random.SeedSequence([seed, first_row]).generate_state(1)[0]))
        cache, new = None, []
        with torch.inference_mode():
            for _ in range(new_tokens):
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                            logits_to_keep=1, **cache_arg(cache))
                cache = output_cache(out)
                logits = out.logits[:, -1].float()
                if temperature is None:
                    nxt = logits.argmax(-1)
                else:
                    nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
                new.append(nxt)
                ids, pos = nxt[:, None], pos[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones((n, 1))], 1)
        return torch.stack(new, 1).cpu().numpy().astype(np.int64)


ENGINES = {"loop": LoopDecoder, "plain": PlainDecoder}  # --engine / --distill-engine: name -> text maker
