"""``--method greedy``: plain autoregressive greedy decoding with transformers' ``generate`` on
the base model, one prompt at a time (no padding). The reference every lossless method must
equal token for token, and the baseline every speed table compares against; it does not run on
latticedraft's loop (latticedraft's own greedy loop is ``--drafter none``)."""

from __future__ import annotations

import time

from latticedraft.decoding.registry import Method


def greedy_decode(model, prompts: list, *, max_new_tokens: int = 64, eos_token_id=None, on_tokens=None):
    """``generate(do_sample=False)`` per prompt; a ``DecodeResult`` whose rows emitted one token per
    call (outputs cut after the first EOS)."""
    import torch

    from latticedraft.decoding.rows import Rows
    from latticedraft.decoding.runs.prompt_length import checked_prompts

    base = getattr(model, "base", model)
    rows = Rows(checked_prompts(model, prompts, max_new_tokens), max_new_tokens, eos_token_id, on_tokens)
    dev = next(base.parameters()).device
    eos = sorted(rows.eos) or None
    for i, p in enumerate(rows.prompts):
        ids = torch.as_tensor(p[None], device=dev)
        with torch.no_grad():
            gen = base.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                                eos_token_id=eos, pad_token_id=0, num_beams=1, temperature=None, top_p=None,
                                top_k=None)
        for t in gen[0, len(p):].tolist():
            if rows.emit(i, [t]):
                break
    t = time.perf_counter() - rows.t0
    return rows.result("generate", "plain autoregressive decoding", {"model": t})


def _run(session, prompts, options, req):
    return greedy_decode(session.model, prompts, max_new_tokens=req.max_new_tokens, eos_token_id=req.eos_token_id,
                         on_tokens=req.on_tokens)


METHOD = Method(
    name="greedy",
    summary="plain autoregressive greedy decoding with transformers' generate (the baseline every other method is "
            "measured against)",
    lossless=True,
    sampling="never",
    options=(),
    configure=lambda values, given: None,
    label=lambda options, sampling: "greedy",
    settings=lambda options, sampling: {},
    run=_run,
)
