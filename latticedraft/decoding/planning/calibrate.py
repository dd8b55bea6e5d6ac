"""Count a session's own greedy decode steps into acceptance tables (``acceptance.py``).

Every recorded step of a greedy decode (``Request(record_steps=True)``) gives the heads' lattice,
the paths verified, the history up to the root and, from the row's output, the tokens the target
chose after the root: the data the tables count. The draft sources whose tables are counted
propose again on the same histories (``paths(history)``). No decode runs for it: the steps are
the session's own, recorded while it decodes the user's prompts.
"""

from __future__ import annotations

import numpy as np

from latticedraft.decoding.planning.acceptance import DEPTH, AcceptanceModel, fit


def counted(result, sources: tuple = ()) -> AcceptanceModel:
    """The counts of ``result``'s recorded steps (a greedy ``DecodeResult``); sources: (name,
    proposer, bins kind) of the sources whose tables are counted, from their ``paths(history)``."""
    lattices, greedy, histories, drafts = [], [], [], []
    for st in result.steps:
        seq = result.sequences[st.row]
        at = len(st.history) - len(seq.prompt_ids)  # seq.tokens[at] is the token after the root
        depth = max(st.sausage.h if st.sausage is not None else 0, DEPTH if sources else 0)
        follow = seq.tokens[at : at + depth]
        if len(follow):
            lattices.append(st.sausage)  # None for a step without heads: source data only
            greedy.append(np.asarray(follow, dtype=np.int64))
            histories.append(st.history)
            drafts.append(st.drafts)
    return fit(lattices, greedy, histories, drafts=drafts, paths={name: (p.paths, bins) for name, p, bins in sources})
