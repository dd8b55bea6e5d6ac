"""``latticedraft <group> <verb>``: parses arguments, calls the library, prints results.

Thin by design: no algorithm lives here. Each group registers its sub-commands in an
``_add_<group>`` function; every command is a function ``(args) -> int``. User errors
(``LatticedraftError``) print as one line ``error: ...`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from latticedraft.errors import LatticedraftError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="latticedraft", description=__doc__.splitlines()[0])
    groups = parser.add_subparsers(dest="group", required=True, metavar="<group>")
    for add in _GROUPS:
        add(groups)
    return parser


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
    g.add_argument("--save-dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="dtype of the saved weights")
    g.add_argument("--device", default=None, help="torch device (default cpu)")
    g.add_argument("--encoding-errors", default="strict", choices=["strict", "replace"], help="on non-UTF-8 corpus bytes")


def _optim_config(a):
    from latticedraft.gpu.train import OptimConfig

    return OptimConfig(steps=a.steps, lr=a.lr, batch_size=a.batch_size, seq_len=a.seq_len, grad_accum=a.grad_accum,
                       warmup_frac=a.warmup_frac, weight_decay=a.weight_decay, checkpoint_every=a.checkpoint_every,
                       seed=a.seed)


def _cmd_train_lm(a) -> int:
    from latticedraft.gpu.train import LMArch, train_lm
    from latticedraft.lm.corpus import resolve_corpus

    res = train_lm(a.tokenizer, resolve_corpus(a.corpus), a.out,
                   LMArch(n_embd=a.n_embd, n_layer=a.n_layer, n_head=a.n_head, n_positions=a.n_positions),
                   _optim_config(a), resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                   encoding_errors=a.encoding_errors)
    print(f"trained {res.steps} steps ({res.tokens} tokens, {res.seconds} s); final loss "
          + " ".join(f"{k}={v:.4f}" for k, v in res.losses.items()) + f"; saved to {res.out_dir}")
    return 0


def _cmd_train_heads(a) -> int:
    from latticedraft.gpu.train import train_heads
    from latticedraft.lm.corpus import resolve_corpus

    res = train_heads(a.base, resolve_corpus(a.corpus), a.out, a.heads, a.kind, _optim_config(a), lambdas=a.lambdas,
                      unfreeze=a.unfreeze, lr_base=a.lr_base, lr_stem=a.lr_stem, ffn_dim=a.ffn_dim,
                      tokenizer_path=a.tokenizer, resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                      encoding_errors=a.encoding_errors)
    print(f"trained {res.steps} steps ({res.tokens} tokens, {res.seconds} s); final loss per head "
          + " ".join(f"{k}={v:.4f}" for k, v in res.losses.items()) + f"; saved to {res.out_dir}")
    return 0


def _add_train(groups) -> None:
    grp = groups.add_parser("train", help="train a small causal LM or multi-token heads")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("lm", help="train a GPT-2-style causal LM from scratch (the base, the neural rescorers)")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory holding one")
    p.add_argument("--corpus", nargs="+", required=True, help="files, directories, or stdlib / stdlib:train / stdlib:heldout")
    p.add_argument("--out", required=True, help="output directory (HF format, loadable by AutoModelForCausalLM)")
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-positions", type=int, default=256, help="context length")
    _optim_args(p, steps=500, lr=2e-3)
    p.set_defaults(func=_cmd_train_lm)
    p = verbs.add_parser("heads", help="train heads 2..h of a BlockwiseModel on a base causal LM (loss Σ λ_h L_h)")
    p.add_argument("--base", required=True, help="base model directory (HF format)")
    p.add_argument("--corpus", nargs="+", required=True, help="files, directories, or stdlib / stdlib:train / stdlib:heldout")
    p.add_argument("--heads", type=int, required=True, help="number of heads h, counting the base's own head 1 (≥ 2)")
    p.add_argument("--kind", choices=["stern", "dynamo"], default="stern", help="FFN heads (Stern) or decoder-layer heads (DynaMo)")
    p.add_argument("--out", required=True, help="output directory (heads_config.json names the base relatively)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    p.add_argument("--lambdas", type=float, nargs="+", default=None, help="per-head loss weights λ_1..λ_h (default all 1)")
    p.add_argument("--unfreeze", action="store_true", help="train the base too, with DynaMo's three learning rates")
    p.add_argument("--lr-base", type=float, default=1e-5, help="LR_B: the base's own parameters (with --unfreeze)")
    p.add_argument("--lr-stem", type=float, default=1e-6, help="LR_MB: gradient from heads 2..h into the base (with --unfreeze)")
    p.add_argument("--ffn-dim", type=int, default=None, help="Stern head hidden width (default 4 × hidden size)")
    _optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_heads)


_GROUPS: list = []
_GROUPS.append(_add_train)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LatticedraftError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
