"""Fit the acceptance tables (``acceptance.py``) on held-out prompts by decoding them.

The caller's ``decode`` decodes the prompts greedily-exact with the drafter's own lattices (tree
``fixed``, no context paths, the same slots and draft vocabulary as the run to be planned,
recording every step); every step's lattice, its history and the greedy tokens that followed its
root are the training data (the fitted sources' tables read the same histories).
"""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from latticedraft.decoding.planning.acceptance import DEPTH, AcceptanceModel, fit


def calibrate(decode, prompt_ids: list, *, sources: tuple = (), max_new_tokens: int = 64) -> AcceptanceModel:
    """An ``AcceptanceModel`` from decoding ``prompt_ids`` (held out from what is measured).
    decode(prompt_ids, max_new_tokens, on_tokens) -> a ``DecodeResult`` with its steps recorded
    (the drafter's lattices; a drafter without heads: only the source tables learn); sources:
    (name, proposer, bins kind) of the fitted sources, each table fitted on its proposer's
    ``paths(history)``."""
    with tqdm(total=len(prompt_ids) * max_new_tokens, desc="calibrate", unit="tok", disable=None, leave=False) as bar:
        res = decode(prompt_ids, max_new_tokens, lambda row, new: bar.update(len(new)))
    lattices, greedy, histories, drafts = [], [], [], []
    for st in res.steps:
        seq = res.sequences[st.row]
        at = len(st.history) - len(seq.prompt_ids)  # seq.tokens[at] is the token after the root
        depth = max(st.sausage.h if st.sausage is not None else 0, DEPTH if sources else 0)
        follow = seq.tokens[at : at + depth]
        if len(follow):
            lattices.append(st.sausage)  # None for a drafter without heads: context and LM data only
            greedy.append(np.asarray(follow, dtype=np.int64))
            histories.append(st.history)
            drafts.append(st.drafts)
    paths = {name: (p.paths, bins) for name, p, bins in sources}
    return fit(lattices, greedy, histories, drafts=drafts, paths=paths)
