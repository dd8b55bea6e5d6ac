"""``--method ppd``: predictive pipelined decoding (Yang et al. 2023) as a registry entry; the
decoder, whose outer loop is its own, is ``ppd/pipeline.py``'s ``ppd_decode``. Greedy, exact."""

from __future__ import annotations

from dataclasses import dataclass

from latticedraft.decoding.registry import Method, configure, dests, option


@dataclass(frozen=True)
class PPDOptions:
    """dbar: early-exit layer (1..d-1; None: d // 2); k: candidates; exit_heads: a directory of
    per-layer early-exit heads (``train heads --early-exit``; None: the shared LM head)."""

    dbar: int | None = option(None, "ppd: early prediction after this layer (default: half the layers)",
                              group="self-draft", flag="--exit-layer", type=int, metavar="DBAR")
    k: int = option(3, "ppd: early top-k candidates started per token (default 3)", group="self-draft",
                    flag="--candidates", type=int, metavar="K")
    exit_heads: str | None = option(None, "ppd: per-layer early-exit heads from `train heads --early-exit` (default: "
                                          "the shared LM head)", group="self-draft", metavar="DIR")

    def __post_init__(self):
        from latticedraft.decoding.ppd.pipeline import check_ppd

        check_ppd(self.dbar, self.k)


def _label(o: PPDOptions, sampling) -> str:
    return f"ppd exit-layer={o.dbar or 'd/2'} k={o.k}"


def _settings(o: PPDOptions, sampling) -> dict:
    from dataclasses import asdict

    return asdict(o)


def _prepare(session, o: PPDOptions, batch_size: int) -> None:
    from latticedraft.decoding.ppd.pipeline import check_candidates, check_dbar
    from latticedraft.gpu.models.layer_split import LayerSplit

    d = LayerSplit(session.model).num_layers
    check_dbar(o.dbar or d // 2, d)
    check_candidates(o.k, session.model)
    session.exit_heads(o.exit_heads)  # missing or mismatching heads fail before any output


def _run(session, prompts, o: PPDOptions, req):
    from latticedraft.decoding.ppd.pipeline import ppd_decode

    return ppd_decode(session.model, prompts, dbar=o.dbar, k=o.k, max_new_tokens=req.max_new_tokens,
                      eos_token_id=req.eos_token_id, on_tokens=req.on_tokens, exit_head=session.exit_heads(o.exit_heads))


METHOD = Method(
    name="ppd",
    summary="predictive pipelined decoding: an early exit's top-k candidates start their first layers while the "
            "main pass finishes; one token per step, lossless",
    lossless=True,
    sampling="never",
    options=dests(PPDOptions),
    configure=lambda values, given: configure(PPDOptions, values),
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    files=lambda o: ("exit_heads",),
)
