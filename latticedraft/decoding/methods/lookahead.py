"""Lookahead decoding (Fu et al. 2024, Algorithms 2-3; ``--method lookahead``) on the one loop.

Every step is ONE target call over [root, lookahead branch, verification branch] with the
Figure 2(b) mask (``Verifier.verify`` with a side branch): the lookahead branch is the
row's ``JacobiWindow`` (W x (N-1) guesses, one Jacobi update per step, its n-grams go to the
row's ``NgramPool``); the verification branch is the pool's continuations of the root (at
most G, merged into a trie, which for distinct first tokens is exactly the paper's disjoint
n-grams). The longest continuation the target agrees with is accepted plus one bonus token;
only the accepted nodes' KV is kept. Rows of a batch keep their own window and pool.
``proposers/lookahead.py``'s ``LookaheadProposer`` is that draft source; BPD can run it beside
the heads (``--lookahead-pool``).

With ``sampling`` the candidates are verified by Algorithm 4, the one-hot case of
``accept/sampling.py``: the output then has the target's sampling distribution, as
``generate(do_sample=True)`` with the same settings; the Jacobi window keeps taking the target's
argmax (its guesses only decide what is drafted, never what is emitted).

``SequenceResult.tree_nodes`` records the nodes of each step's forward (root + window + trie).

    >>> r = lookahead_decode(model, [ids], W=15, N=5, G=15, max_new_tokens=64)   # doctest: +SKIP
    >>> r.sequences[0].tokens, r.block_efficiency, r.verify_mode
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from latticedraft.decoding.registry import Method, Request, dests, flags, option, sampling_label
from latticedraft.errors import InputError


@dataclass(frozen=True)
class LookaheadOptions:
    """W: window columns (lookahead size); N: n-gram size (N-1 levels); G: candidates per key
    verified per step (and kept in the pool); prompt_as_reference: start the window from prompt
    tokens and seed the pool with the prompt's n-grams; seed: the window's random start. Each
    option declares its flag (``registry.option``): ``decode``, ``eval`` and ``--lookahead-pool``
    read them from here."""

    W: int = option(15, group="lookahead", flag="--window", type=int, metavar="W",
                    help="W: future positions the Jacobi window guesses per step (15 is the paper's for 7B)")
    N: int = option(5, group="lookahead", flag="--ngram", type=int, metavar="N",
                    help="N: n-gram size; the window keeps N-1 past Jacobi iterates")
    G: int = option(15, group="lookahead", flag="--pool", type=int, metavar="G",
                    help="G: n-grams kept per first token and verified per step; 0 = Jacobi window only")
    prompt_as_reference: bool = option(False, group="lookahead", action="store_true",
                                       help="start the window from prompt tokens and seed the n-gram pool with the "
                                            "prompt's n-grams")
    seed: int = 0

    def __post_init__(self):
        if self.W < 1 or self.N < 2 or self.G < 0:
            raise InputError(f"lookahead needs --window >= 1, --ngram >= 2 and --pool >= 0; got W={self.W}, "
                             f"N={self.N}, G={self.G}")


DESTS = dests(LookaheadOptions)  # window, ngram, pool, prompt_as_reference


def options_from(values: dict, given: set) -> LookaheadOptions:
    """``LookaheadOptions`` of ``--window/--ngram/--pool/--prompt-as-reference`` or of a
    ``--lookahead-config`` file (``tune --method lookahead``), which may not be combined with them."""
    path = values.get("lookahead_config")
    if path:
        for dest in DESTS:
            if dest in given:
                flag = "--" + dest.replace("_", "-")
                raise InputError(f"{flag} does not apply here: --lookahead-config {path} sets W, N, G and "
                                 f"--prompt-as-reference; drop {flag}")
        return LookaheadOptions(**read_lookahead_config(path))
    return LookaheadOptions(**{f.name: f.default if values.get(dest) is None else values[dest]
                               for dest, f, _ in flags(LookaheadOptions)})


def read_lookahead_config(path) -> dict:
    """{"W", "N", "G", "prompt_as_reference"} from a ``tune --method lookahead`` result."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())["lookahead"]
        cfg = {"W": int(d["W"]), "N": int(d["N"]), "G": int(d["G"]),
               "prompt_as_reference": bool(d.get("prompt_as_reference", False))}
    except FileNotFoundError:
        raise InputError(f"--lookahead-config {p} not found; write it with "
                         f"`latticedraft tune --method lookahead --out {p}`") from None
    except IsADirectoryError:
        raise InputError(f"--lookahead-config {p} is a directory; give the JSON file `tune --method lookahead` wrote") from None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as e:
        raise InputError(f"--lookahead-config {p} is not a `tune --method lookahead` result with a 'lookahead' "
                         f"object holding W, N and G ({type(e).__name__}: {e}); rerun the tuner") from None
    if cfg["W"] < 1 or cfg["N"] < 2 or cfg["G"] < 0:
        raise InputError(f"--lookahead-config {p}: W={cfg['W']}, N={cfg['N']}, G={cfg['G']} out of range "
                         "(W >= 1, N >= 2, G >= 0); rerun the tuner")
    return cfg


def lookahead_decode(model, prompts: list, *, W: int = 15, N: int = 5, G: int = 15, max_new_tokens: int = 64,
                     eos_token_id=None, prompt_as_reference: bool = False, seed: int = 0, verify: str = "auto",
                     on_tokens=None, first_row: int = 0, rows: list | None = None, sampling=None,
                     kv_cache: str = "auto"):
    """Lookahead decoding of every prompt; greedy output equals ``generate(do_sample=False)``.

    model: any causal LM (or a BlockwiseModel: only its base head is used). W, N, G: window
    columns, n-gram size, pool candidates per key (paper defaults for 7B models: 15, 5, 15).
    verify: "auto" | "tree" | "batched" (``gpu.verify.modes.choose_mode``). first_row: index of prompts[0]
    in the whole prompt set (seeds each row's window and noise; ``rows`` gives every prompt's id).
    sampling: ``SamplingOptions`` for lossless sampling (None: greedy).
    kv_cache: "auto" | "full" | "rolling"."""
    from latticedraft.decoding.loop import speculative_decode
    from latticedraft.decoding.proposers.lookahead import LookaheadProposer
    from latticedraft.gpu.models import hf
    from latticedraft.gpu.verify.verifier import Verifier

    opts = LookaheadOptions(W, N, G, prompt_as_reference, seed)
    check_step_size(model, opts, len(prompts))
    V = hf.model_vocab_size(getattr(model, "base", model))
    req = Request(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id, sampling=sampling, verify=verify,
                  rows=rows, first_row=first_row, on_tokens=on_tokens)
    res = speculative_decode(Verifier.for_model(model, verify, num_heads=1, kv_cache=kv_cache), prompts,
                             [LookaheadProposer(opts, V)], req)
    res.verify_reason += f"; lookahead W={W} N={N} G={G}" + ("" if sampling is None else f"; sampling {sampling}")
    return res


def check_step_size(model, o: LookaheadOptions, batch: int = 1) -> None:
    """Refuse a window or n-gram size beyond the model's positions, or a step whose nodes (1 +
    (W + G) (N - 1) per row once the window is full) would not fit in memory: its masks (bool
    [n, n] twice), hidden states and keys/values, a lower bound, estimated before allocating."""
    import torch

    from latticedraft.gpu.verify.modes import base_config, model_device, model_dtype, position_limit
    from latticedraft.memory import check_fits

    limit = position_limit(model)
    for flag, v, what in (("--window", o.W, "window column"), ("--ngram", o.N, "n-gram token")):
        if limit and v > limit:
            raise InputError(f"{flag} {v} must be <= {limit}, the model's positions (one {what} per position); "
                             f"lower {flag}")
    cfg = base_config(model)
    H = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0))
    layers = int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "n_layer", 0))
    heads = int(getattr(cfg, "num_attention_heads", 0) or getattr(cfg, "n_head", 1))
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads) * (H // max(heads, 1))
    item = torch.finfo(model_dtype(model)).bits // 8

    def need(s: dict) -> int:
        n = 1 + (s["--window"] + s["--pool"]) * (s["--ngram"] - 1)
        return batch * (2 * n * n + n * item * (4 * H + 2 * layers * kv))

    check_fits({"--window": o.W, "--ngram": o.N, "--pool": o.G}, need, device=model_device(model),
               doing="for one lookahead step's nodes (masks, hidden states, keys and values)",
               low={"--ngram": 2, "--pool": 0})


def _prepare(session, o: LookaheadOptions, batch_size: int) -> None:
    check_step_size(session.model, o, batch_size)


def _configure(values: dict, given: set) -> LookaheadOptions:
    return options_from(values, given)


def _label(o: LookaheadOptions, sampling) -> str:
    return f"lookahead W={o.W} N={o.N} G={o.G}" + sampling_label(sampling)


def _settings(o: LookaheadOptions, sampling) -> dict:
    from dataclasses import asdict

    return {**asdict(o), "sampling": None if sampling is None else asdict(sampling)}


def _run(session, prompts, o: LookaheadOptions, req):
    return lookahead_decode(session.model, prompts, W=o.W, N=o.N, G=o.G, prompt_as_reference=o.prompt_as_reference,
                            seed=o.seed, max_new_tokens=req.max_new_tokens, eos_token_id=req.eos_token_id,
                            verify=req.verify, on_tokens=req.on_tokens, rows=req.rows, sampling=req.sampling)


METHOD = Method(
    name="lookahead",
    summary="lookahead decoding: a Jacobi window guesses n-grams, a pool verifies them, no heads needed; lossless",
    lossless=True,
    sampling="optional",
    options=(*DESTS, "lookahead_config", "verify"),
    configure=_configure,
    label=_label,
    settings=_settings,
    run=_run,
    prepare=_prepare,
)
