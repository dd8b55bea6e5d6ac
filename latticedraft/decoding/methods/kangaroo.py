"""Kangaroo (Liu et al. 2024): self-speculative decoding with a double early exit; greedy, exact.

Each step of a row, from its root token (the last emitted, in no cache yet):

1. drafting (``KangarooProposer``): the root, then each drafted token, runs once through the
   first ``l`` layers (appending to the proposer's shallow cache) and the adapter
   (``gpu/models/adapter.py``, its own cache); the adapter's top-1 is the next draft, until
   ``gamma`` drafts or a top-1 confidence <= ``eta`` (the second early exit). Rows of a batch
   draft in lock step; a row that stopped drafting carries masked dummy slots;
2. verification: the shared verifier in split mode (``Verifier(model, from_layer=l)``) runs
   layers ``l..d`` once over the kept layer-``l`` states of [root, drafts] (the first ``l``
   layers are never recomputed); the longest draft prefix equal to the full model's argmax is
   accepted plus one bonus token;
3. every cache keeps exactly the accepted slots (the verifier its deep layers', the proposer
   its shallow layers' and the adapter's).

Counting as every decoder: the prefill emits 1 token, each step (one deep pass) emits
accepted + 1; ``tree_nodes`` records 1 + drafted tokens per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from latticedraft.decoding.registry import Method, Request, configure, dests, option


@dataclass(frozen=True)
class KangarooOptions:
    """gamma: most drafts per step (``--gamma``, shared); eta: drafting stops when the adapter's
    top-1 probability is <= eta; adapter: the adapter directory (None: the bundled
    ``data/adapter-kangaroo``)."""

    gamma: int = 6
    eta: float = option(0.6, "kangaroo: stop drafting when the adapter's top-1 probability is <= eta (default 0.6)",
                        group="self-draft", type=float)
    adapter: str | None = option(None, "kangaroo: the adapter from `train adapter` (default data/adapter-kangaroo; "
                                       "its exit layer is l)", group="self-draft", metavar="DIR")

    def __post_init__(self):
        from latticedraft.decoding.proposers.kangaroo import check_kangaroo

        check_kangaroo(self.gamma, self.eta)


def acceptance_by_position(sequences) -> list[float]:
    """Early-exit acceptance rate per draft position j = 1, 2, ...: of the steps that drafted at
    least j tokens, the fraction whose first j drafts were all accepted (from ``accepted_drafts``
    and ``tree_nodes`` = 1 + drafted of each step)."""
    drafted = [n - 1 for s in sequences for n in s.tree_nodes]
    accepted = [a for s in sequences for a in s.accepted_drafts]
    top = max(drafted, default=0)
    out = []
    for j in range(1, top + 1):
        tried = [a for a, n in zip(accepted, drafted) if n >= j]
        out.append(round(sum(a >= j for a in tried) / len(tried), 4) if tried else 0.0)
    return out


def kangaroo_decode(model, prompts: list, adapter, *, gamma: int = 6, eta: float = 0.6, max_new_tokens: int = 64,
                    eos_token_id=None, on_tokens=None, first_row: int = 0, rows: list | None = None):
    """Greedy Kangaroo decoding on the one loop; output equals ``generate(do_sample=False)``.

    model: an HF causal LM (or a BlockwiseModel: its base runs); adapter: a ``KangarooAdapter``
    for that base (its ``exit_layer`` is l). prompts: int sequences (>= 1 token each)."""
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.decoding.proposers.kangaroo import KangarooProposer
    from latticedraft.gpu.models.layer_split import LayerSplit
    from latticedraft.gpu.verify.verifier import Verifier

    proposer = KangarooProposer(LayerSplit(model), adapter, gamma, eta)
    req = Request(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                  rows=rows, first_row=first_row, on_tokens=on_tokens)
    verifier = Verifier.for_model(model, num_heads=1, from_layer=proposer.exit_layer)
    res = speculative_decode(verifier, prompts, [proposer], req)
    res.verify_reason = f"kangaroo l={proposer.exit_layer} gamma={gamma} eta={eta}; {res.verify_reason}"
    return res


def _label(o: KangarooOptions, sampling) -> str:
    return f"kangaroo gamma={o.gamma} eta={o.eta}"


def _settings(o: KangarooOptions, sampling) -> dict:
    from dataclasses import asdict

    return asdict(o)


def _prepare(session, o: KangarooOptions, batch_size: int) -> None:
    session.adapter(o.adapter)  # a missing or mismatching adapter fails before any output


def _run(session, prompts, o: KangarooOptions, req):
    return kangaroo_decode(session.model, prompts, session.adapter(o.adapter), gamma=o.gamma, eta=o.eta,
                           max_new_tokens=req.max_new_tokens, eos_token_id=req.eos_token_id, on_tokens=req.on_tokens,
                           rows=req.rows)


METHOD = Method(
    name="kangaroo",
    summary="Kangaroo: drafts from the first l layers + an adapter, verifies with the remaining layers over the "
            "stored states; lossless",
    lossless=True,
    sampling="never",
    options=("gamma", *dests(KangarooOptions)),
    configure=lambda values, given: configure(KangarooOptions, values),
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    files=lambda o: ("adapter",),
)
