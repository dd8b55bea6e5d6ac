"""``--method mtad``: multi-token assisted decoding (Qin et al.) on the one loop, APPROXIMATE
sampling: ``proposers/mtad.py``'s beam-sampled drafts, accepted by ``accept/mtad.py``'s joint
rule. Paper defaults: gamma = 4, W = 8 beams, tau = 0.1, top-k 20 then top-p 0.9."""

from __future__ import annotations

from dataclasses import dataclass

from latticedraft.decoding.registry import Method, configure, dests, option, sampling_label
from latticedraft.decoding.runs.loaders import DRAFT_MODEL_HINT
from latticedraft.errors import InputError


@dataclass(frozen=True)
class MtadOptions:
    """gamma: draft tokens per step (``--gamma``, shared); beams: W of beam sampling; tau: the
    acceptance threshold."""

    gamma: int = 4
    beams: int = option(8, "MTAD: beams of the draft model's beam sampling (default 8)", group="mtad", type=int)
    tau: float = option(0.1, "MTAD: accept the longest draft prefix whose joint ratio min(1, p/q) exceeds TAU "
                             "(default 0.1; >= 1: ordinary sampling). MTAD is approximate, not lossless",
                        group="mtad", type=float)

    def __post_init__(self):
        from latticedraft.decoding.proposers.mtad import check_mtad

        check_mtad(self.gamma, self.beams, self.tau)


def _configure(values: dict, given: set) -> MtadOptions:
    if values.get("draft_model") is None:
        raise InputError(f"--method mtad needs an auxiliary draft model: {DRAFT_MODEL_HINT}")
    return configure(MtadOptions, values)


def _label(o: MtadOptions, sampling) -> str:
    return f"mtad gamma={o.gamma} beams={o.beams} tau={o.tau} (approximate)" + sampling_label(sampling)


def _settings(o: MtadOptions, sampling) -> dict:
    from dataclasses import asdict

    return {**asdict(o), "sampling": asdict(sampling)}


def _prepare(session, o: MtadOptions, batch_size: int) -> None:
    _ = session.draft_model  # a missing or mismatched draft model fails before any output


def _run(session, prompts, o: MtadOptions, req):
    from latticedraft.decoding.accept.mtad import MtadRule
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.decoding.proposers.mtad import MtadProposer

    return speculative_decode(session.model, prompts, [MtadProposer(session.draft_model, o.gamma, o.beams)],
                              req, rule=MtadRule(req.sampling, o.tau))


METHOD = Method(
    name="mtad",
    summary="multi-token assisted decoding: a draft model beam-samples, the target accepts by a joint-probability "
            "threshold; APPROXIMATE sampling (not lossless)",
    lossless=False,
    sampling="always",
    options=("draft_model", "gamma", *dests(MtadOptions), "verify"),
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
    defaults={"top_k": 20, "top_p": 0.9},
    files=lambda o: ("draft_model",),
)
