"""Multi-turn chat records (Spec-Bench's ``{"turns": [...]}``): each later turn is asked after the
model's own answer to the turns before it, as Spec-Bench and MT-bench do.

A record with k user turns is decoded k times. Turn 1 starts from its first user message; turn
j + 1 from the conversation so far (every earlier user turn, the model's answer to it -- the text
of its new tokens, special tokens left out, stripped -- then the next user turn) through the chat
template. Plain ``prompt`` and ``messages`` records have one turn. ``Conversations`` keeps each
prompt's answers; ``rounds`` drives any decoder through them, a round per turn, so the prompts
of a round still decode together in batches.

    >>> talk = Conversations(session, prompts, fit=lambda ids, names: ids)  # doctest: +SKIP
    >>> rounds(first_ids, decode_round, talk, on_final=write)                         # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def user_turns(prompt) -> list[str]:
    """The user turns of a ``prompt_set.Prompt`` (a record's ``turns``); one text for any other record or string."""
    rec = getattr(prompt, "record", None) or {}
    if getattr(prompt, "messages", None) is not None and "turns" in rec and "messages" not in rec:
        return list(rec["turns"])
    return [prompt if isinstance(prompt, str) else prompt.text]


def messages_after(turns: list[str], answers: list, tokenizer) -> list[dict]:
    """The chat messages that ask ``turns[len(answers)]``: each earlier user turn and the model's
    answer to it (``answers``: token ids, int[n] each; their text, special tokens left out,
    stripped), then that turn."""
    msgs = []
    for turn, answer in zip(turns, answers):
        text = tokenizer.decode([int(t) for t in answer], skip_special_tokens=True).strip()
        msgs += [{"role": "user", "content": turn}, {"role": "assistant", "content": text}]
    return msgs + [{"role": "user", "content": turns[len(answers)]}]


class Conversations:
    """Each prompt's answers so far. ``session``: its tokenizer and chat template; ``prompts``: the
    decoded prompts (``Prompt``s or strings; a chat record only where the run is a chat, as
    ``chat.prompt_ids`` refuses it otherwise); ``fit(ids, names)``: a later turn's ids (a list of
    int64[t]) made to fit the model (``prompt_length.fit_prompts`` with the run's settings)."""

    def __init__(self, session, prompts: list, fit: Callable[[list, list], list]):
        self.session, self.prompts, self.fit = session, prompts, fit
        self.turns = [user_turns(p) for p in prompts]
        self.results: list[list] = [[] for _ in prompts]  # prompt -> its turns' DecodeResults so far

    def done(self, i: int, result) -> np.ndarray | None:
        """Record prompt ``i``'s answer to its current turn (``result``: a ``DecodeResult`` of that
        prompt alone); the ids of its next turn (int64[t]), or None when its conversation is over."""
        self.results[i].append(result)
        k = len(self.results[i])
        if k == len(self.turns[i]):
            return None
        answers = [res.sequences[0].tokens for res in self.results[i]]
        ids = self.session.chat_template().ids(messages_after(self.turns[i], answers, self.session.tokenizer))
        p = self.prompts[i]
        name = f"--prompts id {p.id!r} (line {p.line}) turn {k + 1}" if hasattr(p, "id") else f"turn {k + 1}"
        return self.fit([ids], [name])[0]

    def records(self, i: int) -> list[dict]:
        """Prompt ``i``'s records (``results.records``), one per turn, each with that turn's user text."""
        from latticedraft.decoding.results import records

        s = self.session
        dtype = getattr(s, "dtype", None)
        return [records(res, s.tokenizer, s.base_dir, [turn], dtype)[0]
                for turn, res in zip(self.turns[i], self.results[i])]

    def record(self, i: int) -> dict:
        """Prompt ``i``'s one record: its last turn's, with ``turns`` (every turn's record, in
        order) where it has several."""
        recs = self.records(i)
        return recs[0] if len(recs) == 1 else {**recs[-1], "turns": recs}


def rounds(ids: list, decode_round: Callable, talk: Conversations, on_final: Callable[[int], None]) -> None:
    """Decode every prompt's turns: round k decodes the k-th turn of the prompts that have one.
    ``ids``: the first turns' ids; ``decode_round(index, ids, on_done)`` decodes prompts ``index``
    (positions in ``talk.prompts``) from ``ids`` and calls ``on_done(j, result)`` with
    ``index[j]``'s ``DecodeResult`` alone; ``on_final(i)`` once prompt i's last turn is done."""
    index = list(range(len(ids)))
    while index:
        later: list[tuple[int, np.ndarray]] = []

        def on_done(j: int, result, index=index, later=later) -> None:
            i = index[j]
            nxt = talk.done(i, result)
            if nxt is None:
                on_final(i)
            else:
                later.append((i, nxt))

        decode_round(index, ids, on_done)
        later.sort(key=lambda x: x[0])  # prompt order (a continuous batch finishes them out of order)
        index, ids = [i for i, _ in later], [x for _, x in later]
