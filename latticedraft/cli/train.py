"""``latticedraft train lm | heads | adapter``: train the base LM, multi-token heads, Kangaroo's adapter and PPD's exit heads."""

from __future__ import annotations

import argparse
from pathlib import Path

from latticedraft.cli.args import stdin_corpus
from latticedraft.cli.train_distill import add_draft_model_parser, distill_args, distill_config


def _optim_args(p: argparse.ArgumentParser, steps: int, lr: float) -> None:
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
    g.add_argument("--stop-after", type=int, default=None, help="stop after N steps this run, leaving a checkpoint to --resume")
    g.add_argument("--save-dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="dtype of the saved weights")
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--encoding-errors", default="strict", choices=["strict", "replace"],
                   help="non-UTF-8 bytes in the corpus: fail naming the byte (strict) or replace them")


def _optim_config(a):
    from latticedraft.gpu.train.loop import OptimConfig

    return OptimConfig(steps=a.steps, lr=a.lr, batch_size=a.batch_size, seq_len=a.seq_len, grad_accum=a.grad_accum,
                       warmup_frac=a.warmup_frac, weight_decay=a.weight_decay, checkpoint_every=a.checkpoint_every,
                       seed=a.seed)


def _print_trained(res, loss_label: str) -> int:
    """One line on a ``TrainResult``: where a ``--stop-after`` run stopped, or the final losses and output."""
    if not res.finished:
        print(f"stopped at step {res.steps}; continue with --resume")
        return 0
    print(f"trained {res.steps} steps ({res.tokens} tokens, {res.seconds} s); {loss_label} "
          + " ".join(f"{k}={v:.4f}" for k, v in res.losses.items()) + f"; saved to {res.out_dir}")
    return 0


def _check_train(a) -> None:
    """What ``train lm`` / ``train heads`` can check before reading the corpus or loading a model."""
    from latticedraft.cli.checks import at_least, check_device, finite
    from latticedraft.paths import check_writable

    check_device(a.device)
    check_writable(a.out, "--out", "directory")
    for d in ("steps", "batch_size", "seq_len", "grad_accum", "checkpoint_every", "stop_after", "sliding_window", "ffn_dim"):
        at_least(a, d, 1)
    for d in ("lr", "warmup_frac", "weight_decay"):
        finite(a, d)


def _cmd_train_lm(a) -> int:
    from latticedraft.gpu.train.lm import LMArch, train_lm
    from latticedraft.lm.corpus import resolve_corpus

    _check_train(a)

    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_lm(a.tokenizer, files, a.out,
                       LMArch(n_embd=a.n_embd, n_layer=a.n_layer, n_head=a.n_head, n_positions=a.n_positions,
                              family=a.family, sliding_window=a.sliding_window, ffn_dim=a.ffn_dim),
                       _optim_config(a), resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                       encoding_errors=a.encoding_errors, stop_after=a.stop_after)
    return _print_trained(res, "final loss")


def _cmd_train_heads(a) -> int:
    from latticedraft.gpu.train.heads import train_heads
    from latticedraft.lm.corpus import resolve_corpus

    _check_train(a)
    if a.early_exit:
        return _cmd_train_exit_heads(a)
    if a.heads is None:
        from latticedraft.errors import InputError

        raise InputError("train heads needs --heads H (the number of heads), or --early-exit for PPD's per-layer heads")

    distill = distill_config(a)
    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_heads(a.base, files, a.out, a.heads, a.kind, _optim_config(a), lambdas=a.lambdas,
                          unfreeze=a.unfreeze, lr_base=a.lr_base, lr_stem=a.lr_stem, ffn_dim=a.ffn_dim,
                          tokenizer_path=a.tokenizer, resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                          encoding_errors=a.encoding_errors, stop_after=a.stop_after, distill=distill,
                          token_input=a.token_input)
    return _print_trained(res, "final loss per head")


def _cmd_train_exit_heads(a) -> int:
    """``train heads --early-exit``: PPD's per-layer early-exit heads (``gpu/exit_heads.py``)."""
    from latticedraft.cli.checks import refuse_given
    from latticedraft.gpu.train.self_draft import train_exit_heads
    from latticedraft.lm.corpus import resolve_corpus

    refuse_given(a, ("heads", "lambdas", "ffn_dim", "self_distill", "token_input"),
                 "--early-exit trains one head per layer by distillation")
    if a.kind != "stern" or a.unfreeze:
        from latticedraft.errors import InputError

        raise InputError("--early-exit trains early-exit heads on a frozen base; drop --kind and --unfreeze")
    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_exit_heads(a.base, files, a.out, _optim_config(a), tokenizer_path=a.tokenizer, resume=a.resume,
                               save_dtype=a.save_dtype, device=a.device, encoding_errors=a.encoding_errors,
                               stop_after=a.stop_after)
    return _print_trained(res, "final distillation loss per layer")


def _cmd_train_adapter(a) -> int:
    """``train adapter``: Kangaroo's self-drafting adapter (``gpu/adapter.py``)."""
    from latticedraft.gpu.train.self_draft import train_adapter
    from latticedraft.lm.corpus import resolve_corpus

    _check_train(a)
    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_adapter(a.base, files, a.out, a.exit_layer, _optim_config(a), tokenizer_path=a.tokenizer,
                            resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                            encoding_errors=a.encoding_errors, stop_after=a.stop_after)
    return _print_trained(res, "final")


def _train_corpus_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", nargs="+", required=True,
                   help="files, directories, stdlib / stdlib:train / stdlib:heldout, or - for standard input")


def add_parser(groups) -> None:
    grp = groups.add_parser("train", help="train a small causal LM or multi-token heads",
                            description="Train the models latticedraft decodes with: a small causal LM from scratch "
                                        "(`train lm`) or multi-token heads on a base LM (`train heads`).")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("lm", help="train a GPT-2- or Mistral-style causal LM from scratch (the base, the rescorers)",
                         description="Train a GPT-2- or Mistral-style causal LM from scratch on a corpus (files, directories or "
                                     "the standard library; - reads standard input) and save it in HF format with "
                                     "its tokenizer. Checkpoints every --checkpoint-every steps; --resume continues.")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory holding one")
    _train_corpus_arg(p)
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR",
                   help="output directory (HF format, loadable by AutoModelForCausalLM)")
    p.add_argument("--n-embd", type=int, default=256, help="hidden size")
    p.add_argument("--n-layer", type=int, default=4, help="decoder layers")
    p.add_argument("--n-head", type=int, default=4, help="attention heads per layer")
    p.add_argument("--n-positions", type=int, default=256, help="context length")
    p.add_argument("--family", choices=["gpt2", "mistral"], default="gpt2",
                   help="gpt2 (learned positions, GELU MLP) or mistral (RoPE, SwiGLU, optional sliding window)")
    p.add_argument("--sliding-window", type=int, default=None, metavar="W",
                   help="mistral: attend to the last W positions only (default: full causal attention)")
    p.add_argument("--ffn-dim", type=int, default=None, help="mistral: SwiGLU width (default 8/3 x --n-embd)")
    _optim_args(p, steps=500, lr=2e-3)
    p.set_defaults(func=_cmd_train_lm)
    p = verbs.add_parser("heads", help="train heads 2..h of a BlockwiseModel on a base causal LM (loss Σ λ_h L_h)",
                         description="Train multi-token heads (Stern FFN heads or DynaMo decoder-layer heads) on a "
                                     "frozen (or --unfreeze) base causal LM; saves heads_config.json and "
                                     "heads.safetensors, naming the base relatively.")
    p.add_argument("--base", required=True, help="base model directory (HF format)")
    _train_corpus_arg(p)
    p.add_argument("--heads", type=int, default=None, help="number of heads h, counting the base's own head 1 (≥ 2)")
    p.add_argument("--kind", choices=["stern", "dynamo"], default="stern", help="FFN heads (Stern) or decoder-layer heads (DynaMo)")
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR",
                   help="output directory (heads_config.json names the base relatively)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    p.add_argument("--lambdas", type=float, nargs="+", default=None, help="per-head loss weights λ_1..λ_h (default all 1)")
    p.add_argument("--unfreeze", action="store_true", help="train the base too, with DynaMo's three learning rates")
    p.add_argument("--lr-base", type=float, default=1e-5, help="LR_B: the base's own parameters (with --unfreeze)")
    p.add_argument("--lr-stem", type=float, default=1e-6, help="LR_MB: gradient from heads 2..h into the base (with --unfreeze)")
    p.add_argument("--ffn-dim", type=int, default=None, help="Stern head hidden width (default 4 × hidden size)")
    p.add_argument("--token-input", action="store_true",
                   help="Stern heads that also read the embedding of the base's greedy next token (EAGLE's token "
                        "input): head j knows token t+1 when it drafts token t+j")
    p.add_argument("--early-exit", action="store_true",
                   help="instead: one early-exit head per layer 1..d-1 for PPD (--method ppd --exit-heads DIR), "
                        "distilled from the full model")
    distill_args(p, switch=True)
    _optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_heads)
    p = verbs.add_parser("adapter", help="train Kangaroo's self-drafting adapter on the base's first l layers",
                         description="Train Kangaroo's adapter (one attention layer and two norms on the states after "
                                     "layer l, the base's LM head shared) by distillation from the frozen full model; "
                                     "saves adapter.json and adapter.safetensors (decode --method kangaroo --adapter DIR).")
    p.add_argument("--base", required=True, help="base model directory (HF format; GPT-2, LLaMA or Mistral style)")
    _train_corpus_arg(p)
    p.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output directory")
    p.add_argument("--exit-layer", type=int, default=2, help="l: the adapter reads the states after layer l (default 2)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    _optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_adapter)
    add_draft_model_parser(verbs)
