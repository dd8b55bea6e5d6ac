"""The decode loop as self-distillation's text maker: ``LoopDecoder`` is the
``gpu.train.continuations.BaseDecoder`` the training commands hand to ``train heads
--self-distill`` and ``train draft-model`` (``gpu/`` knows no algorithm, so the loop comes from here).

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


class LoopDecoder:
    """The base in ``base_dir`` (tokenizer at ``tokenizer_path``, None: beside the base) continuing
    prompts with latticedraft's own loop: ``bpd`` with no drafter, so each row is what ``latticedraft
    decode --drafter none`` writes. The ``Session`` is opened at the first decode (a run the cache
    serves loads no model); end-of-text stops no row."""

    def __init__(self, base_dir, tokenizer_path=None, device=None):
        self.base_dir, self.tokenizer_path, self.device = Path(base_dir), tokenizer_path, device
        self._session, self._ends, self._chat = None, [], None

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
