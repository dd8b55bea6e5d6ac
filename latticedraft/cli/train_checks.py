"""What every ``train`` verb shares, in one place: its options (``optim_args``, ``corpus_arg``;
``optim_config`` reads them back), the checks it runs before it reads a corpus or loads a model,
and the one line it prints on the result (``print_trained``).

A verb opts in with two calls at the top of its command function, before ``stdin_corpus``::

    base = check_training(a, base_dir=a.base)   # ranges, corpus files, base shape
    ... the verb's own checks against ``base`` (a ``footprint.BaseShape``: layers, positions, vocab) ...
    check_training_memory(a, {"--batch-size": a.batch_size, "--seq-len": a.seq_len},
                          lambda s: footprint.adapter_bytes(base, s["--batch-size"], s["--seq-len"]))

``check_training`` needs the options of ``optim_args``. The ``--out`` rule runs before it: each
verb declares its output with ``output_options.out_dir`` (a new verb's kind is an
``outputs.OutputKind``; ``outputs.register`` it so other commands can name it), and ``main`` claims
it before the verb starts. The library's ``train_*`` function repeats the claim (cheap), so
callers of the library are protected too.
"""

from __future__ import annotations

import argparse
import math

from latticedraft.cli.args import DTYPES
from latticedraft.errors import InputError


def optim_args(p: argparse.ArgumentParser, steps: int, lr: float) -> None:
    """The options every ``train`` verb shares: optimisation, checkpoints, --resume / --force, device."""
    g = p.add_argument_group("optimisation (AdamW β=(0.9, 0.95), ε=1e-8, cosine schedule)")
    g.add_argument("--steps", type=int, default=steps, help=f"optimizer updates (default {steps})")
    g.add_argument("--lr", type=float, default=lr, help=f"peak learning rate (default {lr})")
    g.add_argument("--batch-size", type=int, default=16, help="windows per micro-batch (default 16)")
    g.add_argument("--seq-len", type=int, default=256, help="tokens per window (default 256)")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per update (default 1)")
    g.add_argument("--warmup-frac", type=float, default=0.01, help="linear warm-up fraction of the steps (default 0.01)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default 0)")
    g.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default 100)")
    g.add_argument("--seed", type=int, default=0, help="seed for initialisation and batch order (default 0)")
    g.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt (same settings required)")
    g.add_argument("--force", action="store_true",
                   help="replace an earlier output of this command in --out, or discard its unfinished checkpoint "
                        "(a directory holding anything else is refused)")
    g.add_argument("--stop-after", type=int, default=None, help="stop after N steps this run, leaving a checkpoint to --resume")
    g.add_argument("--autocast", default=None, choices=["bfloat16"],
                   help="run each forward and loss in bfloat16 under torch.autocast (weights, gradients and the "
                        "optimizer stay float32): about 2x faster on CPUs with AVX512-BF16/AMX and on GPUs "
                        "(default: float32)")
    g.add_argument("--save-dtype", default="float32", choices=DTYPES, help="dtype of the saved weights")
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--encoding-errors", default="strict", choices=["strict", "replace"],
                   help="non-UTF-8 bytes in the corpus: fail naming the byte (strict) or replace them")


def corpus_arg(p: argparse.ArgumentParser) -> None:
    """``--corpus``: what every verb that reads text trains on."""
    p.add_argument("--corpus", nargs="+", required=True,
                   help="files, directories, stdlib / stdlib:train / stdlib:heldout, or - for standard input")


def optim_config(a):
    """The ``OptimConfig`` of the ``optim_args`` options."""
    from latticedraft.gpu.train.loop import OptimConfig

    return OptimConfig(steps=a.steps, lr=a.lr, batch_size=a.batch_size, seq_len=a.seq_len, grad_accum=a.grad_accum,
                       warmup_frac=a.warmup_frac, weight_decay=a.weight_decay, checkpoint_every=a.checkpoint_every,
                       seed=a.seed, autocast=a.autocast)


def print_trained(res, loss_label: str) -> int:
    """One line on a ``TrainResult``: where a ``--stop-after`` run stopped, or the final losses and output."""
    if not res.finished:
        print(f"stopped at step {res.steps}; continue with --resume")
        return 0
    print(f"trained {res.steps} steps ({res.tokens} tokens, {res.seconds} s); {loss_label} "
          + " ".join(f"{k}={v:.4f}" for k, v in res.losses.items()) + f"; saved to {res.out_dir}")
    return 0


def _positive_finite(a, dest: str, zero_ok: bool = False) -> None:
    from latticedraft.cli.checks import flag

    v = getattr(a, dest, None)
    if v is not None and not (math.isfinite(v) and (v >= 0 if zero_ok else v > 0)):
        raise InputError(f"{flag(a, dest)} {v} must be a finite number {'>= 0' if zero_ok else '> 0'}")


def check_training(a, base_dir=None):
    """Ranges of the shared options, the named corpus files and, with ``base_dir``, the base's shape
    (read without loading it: ``--seq-len`` against its context, the tokenizer against its
    vocabulary). Returns the ``BaseShape`` or None. (``--out`` is claimed before: ``output_options``.)"""
    from latticedraft.cli.checks import at_least, check_device, flag

    check_device(a.device)
    for d in ("steps", "batch_size", "grad_accum", "checkpoint_every", "stop_after"):
        at_least(a, d, 1)
    at_least(a, "seq_len", 2)
    _positive_finite(a, "lr")
    for d in ("lr_base", "lr_stem", "weight_decay"):
        _positive_finite(a, d, zero_ok=True)
    w = a.warmup_frac
    if not (math.isfinite(w) and 0.0 <= w <= 1.0):
        raise InputError(f"{flag(a, 'warmup_frac')} {w} must lie in [0, 1] (a fraction of --steps)")
    from latticedraft.gpu.train.loop import MAX_SEED

    if not 0 <= a.seed <= MAX_SEED:
        raise InputError(f"{flag(a, 'seed')} {a.seed} is outside 0..{MAX_SEED} (it seeds torch and numpy generators)")
    named = [c for c in a.corpus if c != "-"]  # standard input is read later, once
    if named:
        from latticedraft.lm.corpus import resolve_corpus

        resolve_corpus(named)
    if base_dir is None:
        return None
    from latticedraft.gpu.models.hf import check_vocab_fits
    from latticedraft.gpu.train.footprint import read_base_shape
    from latticedraft.lm.tokenizer import load_tokenizer

    base = read_base_shape(base_dir)
    if base.positions is not None and a.seq_len > base.positions:
        raise InputError(f"--seq-len {a.seq_len} exceeds the base model's context of {base.positions} tokens "
                         f"({base.path}/config.json); use --seq-len 2..{base.positions}")
    tok = getattr(a, "tokenizer", None) or base.path / "tokenizer.json"
    check_vocab_fits(load_tokenizer(tok).get_vocab_size(with_added_tokens=True), base.vocab,
                     where=f"the base model in {base.path}")
    return base


def check_training_memory(a, sizes: dict[str, int], need) -> None:
    """Refuse ``sizes`` (flag -> value) whose training footprint ``need(sizes)`` (bytes, from
    ``footprint.py``) exceeds the memory of ``--device``, naming the largest value that fits."""
    from latticedraft.cli.checks import given
    from latticedraft.memory import check_fits

    dest = {f: d for d, f in getattr(a, "_flags", {}).items()}
    check_fits(sizes, need, device=a.device, doing="to train (weights, optimizer state and one batch's activations)",
               low={"--heads": 2, "--seq-len": 2}, given={f for f in sizes if f in dest and given(a, dest[f])})
