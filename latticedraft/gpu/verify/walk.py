"""The accept walk over verified draft trees: from each row's root, follow the child whose token
the target chose (its argmax, or an acceptance rule's ``choose``) until none matches; the last
choice is the bonus token. Numpy only, given the target's choices per visited node."""

from __future__ import annotations

import numpy as np
import torch

from latticedraft.gpu.verify.tree import build_tree


def walk(trees, argmax_at) -> tuple[list[list[int]], np.ndarray]:
    """Accept walk over all rows at once, level by level: at each level one ``argmax_at``
    call for the rows still matching (at most depth + 1 calls). Each row's path follows
    ``DraftTree.children`` from the root while the target's choice is a child; the first choice that
    is not (or that ``argmax_at`` marks as a stop) is the row's bonus token. ``walk_batched`` runs it
    over drafts laid out as batch rows. Returns (node paths from the root, bonus tokens)."""
    b = len(trees)
    paths = [[0] for _ in range(b)]
    bonus = np.zeros(b, dtype=np.int64)
    live = list(range(b))
    while live:
        am = argmax_at(live, [paths[i][-1] for i in live])
        stop = np.zeros(len(live), dtype=bool)
        if isinstance(am, tuple):  # (tokens, stop): a chooser ending the walk at a token that is a child
            am, stop = am
        nxt = []
        for i, a, end in zip(live, np.asarray(am).tolist(), np.asarray(stop).tolist()):
            child = None if end else trees[i].children[paths[i][-1]].get(a)
            if child is None:
                bonus[i] = a
            else:
                paths[i].append(child)
                nxt.append(i)
        live = nxt
    return paths, bonus


def prefix_of(tree, node: int) -> tuple:
    """The draft tokens from the root (excluded) down to ``node`` of a ``DraftTree``."""
    out = []
    while node > 0:
        out.append(int(tree.tokens[node]))
        node = int(tree.parent[node])
    return tuple(reversed(out))


def node_of(tree, prefix) -> int:
    """The node of ``tree`` reached by the draft tokens ``prefix`` from the root."""
    node = 0
    for t in prefix:
        node = tree.children[node][int(t)]
    return node


def greedy_choice(rows, logits: torch.Tensor, prefixes, logits_at) -> np.ndarray:
    """Greedy acceptance as a ``choose``: the target's argmax at each walked node (int64[m])."""
    return logits.argmax(dim=-1).cpu().numpy()


def walk_batched(seq: np.ndarray, logits: torch.Tensor, choose=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``walk`` with ``choose`` (None: ``greedy_choice``) over drafts laid out as batch rows: seq
    int64[b, p, 1 + d] (root, draft, -1 after its end), logits [b, p, 1 + d, V]. The drafts of a
    row become a trie; trie node -> (the first draft holding that prefix, position). Returns the
    draft whose prefix was accepted, the accepted length and the chosen bonus token, each int64[b]."""
    choose = greedy_choice if choose is None else choose
    b, p, _ = seq.shape
    trees = [build_tree(int(seq[i, 0, 0]), seq[i, :, 1:]) for i in range(b)]
    where = []
    for i, t in enumerate(trees):
        at = {0: (0, 0)}
        for j in range(p):
            node = 0
            for k, tok in enumerate(seq[i, j, 1:].tolist(), start=1):
                if tok < 0:
                    break
                node = t.children[node][tok]
                at.setdefault(node, (j, k))
        where.append(at)

    def at(rows, nodes):
        jk = [where[r][k] for r, k in zip(rows, nodes)]
        return logits[torch.as_tensor(rows), torch.as_tensor([j for j, _ in jk]), torch.as_tensor([k for _, k in jk])]

    def pick(rows, nodes):
        return choose(rows, at(rows, nodes), [prefix_of(trees[r], k) for r, k in zip(rows, nodes)],
                      lambda rs, pres: at(rs, [node_of(trees[r], pre) for r, pre in zip(rs, pres)]))

    paths, bonus = walk(trees, pick)
    best = np.asarray([where[i][path[-1]][0] for i, path in enumerate(paths)], dtype=np.int64)
    nacc = np.asarray([len(path) - 1 for path in paths], dtype=np.int64)
    return best, nacc, bonus
