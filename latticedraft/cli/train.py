"""``latticedraft train lm | heads | adapter``: train the base LM, multi-token heads, Kangaroo's adapter and PPD's exit heads."""

from __future__ import annotations


from latticedraft.cli.args import stdin_corpus
from latticedraft.cli.train_checks import (check_training, check_training_memory, corpus_arg, optim_args,
                                           optim_config, print_trained)
from latticedraft.cli.train_distill import add_draft_model_parser, distill_args, distill_config


def _cmd_train_lm(a) -> int:
    from dataclasses import replace

    from latticedraft.gpu.train import footprint
    from latticedraft.gpu.train.lm import LMArch, train_lm
    from latticedraft.lm.corpus import resolve_corpus
    from latticedraft.lm.tokenizer import load_tokenizer

    check_training(a)
    arch = LMArch(n_embd=a.n_embd, n_layer=a.n_layer, n_head=a.n_head, n_positions=a.n_positions, family=a.family,
                  sliding_window=a.sliding_window, ffn_dim=a.ffn_dim)
    arch.check(a.seq_len)
    vocab = load_tokenizer(a.tokenizer).get_vocab_size(with_added_tokens=True)
    sizes = {"--n-embd": a.n_embd, "--n-layer": a.n_layer, "--n-positions": a.n_positions,
             "--batch-size": a.batch_size, "--seq-len": a.seq_len}
    if a.ffn_dim is not None:
        sizes["--ffn-dim"] = a.ffn_dim
    check_training_memory(a, sizes, lambda s: footprint.lm_bytes(
        vocab, s["--n-embd"], s["--n-layer"], s["--n-positions"],
        s.get("--ffn-dim", replace(arch, n_embd=s["--n-embd"]).ffn), s["--batch-size"], s["--seq-len"]))

    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_lm(a.tokenizer, files, a.out, arch, optim_config(a), resume=a.resume, save_dtype=a.save_dtype,
                       device=a.device, encoding_errors=a.encoding_errors, stop_after=a.stop_after, force=a.force)
    return print_trained(res, "final loss")


def _cmd_train_heads(a) -> int:
    from latticedraft.gpu.train import footprint
    from latticedraft.gpu.train.heads import check_draft_vocab, check_head_options, train_heads
    from latticedraft.lm.corpus import resolve_corpus

    from latticedraft.cli.checks import at_least, refuse_given

    at_least(a, "medusa_layers", 0)
    if a.kind != "medusa":
        refuse_given(a, ("medusa_layers", "medusa_lm_head"), f"--kind {a.kind} heads are not Medusa heads")
    else:
        refuse_given(a, ("ffn_dim",), "Medusa heads have no hidden layer (their blocks are H x H)")
    if a.early_exit:
        return _cmd_train_exit_heads(a)
    if a.heads is None:
        from latticedraft.errors import InputError

        raise InputError("train heads needs --heads H (the number of heads), or --early-exit for PPD's per-layer heads")
    check_head_options(a.heads, a.seq_len, a.lambdas)
    distill = distill_config(a)
    check_draft_vocab(a.draft_vocab, a.kind, a.medusa_lm_head, a.unfreeze, distill)
    base = check_training(a, base_dir=a.base)
    at_least(a, "ffn_dim", 1)
    sizes = {"--heads": a.heads, "--batch-size": a.batch_size, "--seq-len": a.seq_len}
    if a.kind == "stern" and a.ffn_dim is not None:
        sizes["--ffn-dim"] = a.ffn_dim
    check_training_memory(a, sizes, lambda s: footprint.heads_bytes(
        base, s["--heads"], a.kind, s.get("--ffn-dim", a.ffn_dim or 4 * base.hidden), s["--batch-size"],
        s["--seq-len"], a.unfreeze))

    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_heads(a.base, files, a.out, a.heads, a.kind, optim_config(a), lambdas=a.lambdas,
                          unfreeze=a.unfreeze, lr_base=a.lr_base, lr_stem=a.lr_stem, ffn_dim=a.ffn_dim,
                          medusa_layers=a.medusa_layers, medusa_lm_head=a.medusa_lm_head,
                          tokenizer_path=a.tokenizer, resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                          encoding_errors=a.encoding_errors, stop_after=a.stop_after, force=a.force, distill=distill,
                          token_input=a.token_input, draft_vocab=a.draft_vocab)
    return print_trained(res, "final loss per head")


def _cmd_train_exit_heads(a) -> int:
    """``train heads --early-exit``: PPD's per-layer early-exit heads (``gpu/models/exit_heads.py``)."""
    from latticedraft.cli.checks import refuse_given
    from latticedraft.gpu.train import footprint
    from latticedraft.gpu.train.early_exit import train_exit_heads
    from latticedraft.lm.corpus import resolve_corpus

    refuse_given(a, ("heads", "lambdas", "ffn_dim", "self_distill", "token_input", "draft_vocab"),
                 "--early-exit trains one head per layer by distillation")
    if a.kind != "stern" or a.unfreeze:
        from latticedraft.errors import InputError

        raise InputError("--early-exit trains early-exit heads on a frozen base; drop --kind and --unfreeze")
    base = check_training(a, base_dir=a.base)
    if base.layers < 2:
        from latticedraft.errors import InputError

        raise InputError(f"--early-exit needs a base of at least 2 layers; {base.path} has {base.layers}")
    check_training_memory(a, {"--batch-size": a.batch_size, "--seq-len": a.seq_len},
                          lambda s: footprint.exit_heads_bytes(base, s["--batch-size"], s["--seq-len"]))
    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_exit_heads(a.base, files, a.out, optim_config(a), tokenizer_path=a.tokenizer, resume=a.resume,
                               save_dtype=a.save_dtype, device=a.device, encoding_errors=a.encoding_errors,
                               stop_after=a.stop_after, force=a.force)
    return print_trained(res, "final distillation loss per layer")


def _cmd_train_adapter(a) -> int:
    """``train adapter``: Kangaroo's self-drafting adapter (``gpu/models/adapter.py``)."""
    from latticedraft.errors import InputError
    from latticedraft.gpu.train import footprint
    from latticedraft.gpu.train.early_exit import train_adapter
    from latticedraft.lm.corpus import resolve_corpus

    base = check_training(a, base_dir=a.base)
    if not 1 <= a.exit_layer < base.layers:
        raise InputError(f"--exit-layer {a.exit_layer} must lie in [1, {base.layers - 1}] for a base of {base.layers} "
                         f"layers ({base.path}; the remaining layers verify)")
    check_training_memory(a, {"--batch-size": a.batch_size, "--seq-len": a.seq_len},
                          lambda s: footprint.adapter_bytes(base, s["--batch-size"], s["--seq-len"]))
    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_adapter(a.base, files, a.out, a.exit_layer, optim_config(a), tokenizer_path=a.tokenizer,
                            resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                            encoding_errors=a.encoding_errors, stop_after=a.stop_after, force=a.force)
    return print_trained(res, "final")


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_dir
    from latticedraft.outputs import ADAPTER, EXIT_HEADS, HEADS, TRAINED_LM

    grp = groups.add_parser("train", help="train a base LM, heads, Kangaroo's adapter or a draft model",
                            description="Train the models latticedraft decodes with: a small causal LM from scratch "
                                        "(`train lm`), multi-token heads on a base LM (`train heads`), Kangaroo's "
                                        "adapter (`train adapter`) or a small draft model distilled from a base "
                                        "(`train draft-model`).")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("lm", help="train a GPT-2- or Mistral-style causal LM from scratch (the base, the rescorers)",
                         description="Train a GPT-2- or Mistral-style causal LM from scratch on a corpus (files, directories or "
                                     "the standard library; - reads standard input) and save it in HF format with "
                                     "its tokenizer. Checkpoints every --checkpoint-every steps; --resume continues.")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json or a directory holding one")
    corpus_arg(p)
    out_dir(p, TRAINED_LM, inputs=("tokenizer", "corpus"), required=True,
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
    optim_args(p, steps=500, lr=2e-3)
    p.set_defaults(func=_cmd_train_lm)
    p = verbs.add_parser("heads", help="train heads 2..h of a BlockwiseModel on a base causal LM (loss Σ λ_h L_h)",
                         description="Train multi-token heads (Stern FFN heads, Medusa residual heads or DynaMo "
                                     "decoder-layer heads) on a "
                                     "frozen (or --unfreeze) base causal LM; saves heads_config.json and "
                                     "heads.safetensors, naming the base relatively (with --unfreeze the trained base "
                                     "goes beside them). --self-distill trains on the base's own continuations; "
                                     "--early-exit trains PPD's per-layer early-exit heads instead.")
    p.add_argument("--base", required=True, help="base model directory (HF format)")
    corpus_arg(p)
    p.add_argument("--heads", type=int, default=None, help="number of heads h, counting the base's own head 1 (≥ 2)")
    p.add_argument("--kind", choices=["stern", "medusa", "dynamo"], default="stern",
                   help="FFN heads (Stern), residual SiLU heads (Medusa: exportable to vLLM) or decoder-layer heads (DynaMo)")
    out_dir(p, (HEADS, EXIT_HEADS), inputs=("base", "tokenizer", "corpus"), required=True,
            pick=lambda a: EXIT_HEADS if a.early_exit else HEADS,
            help="output directory (heads_config.json names the base relatively)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    p.add_argument("--lambdas", type=float, nargs="+", default=None, help="per-head loss weights λ_1..λ_h (default all 1)")
    p.add_argument("--unfreeze", action="store_true", help="train the base too, with DynaMo's three learning rates")
    p.add_argument("--lr-base", type=float, default=1e-5, help="LR_B: the base's own parameters (with --unfreeze)")
    p.add_argument("--lr-stem", type=float, default=1e-6, help="LR_MB: gradient from heads 2..h into the base (with --unfreeze)")
    p.add_argument("--ffn-dim", type=int, default=None, help="Stern head hidden width (default 4 × hidden size)")
    p.add_argument("--medusa-layers", type=int, default=1, help="Medusa: residual SiLU blocks per head")
    p.add_argument("--medusa-lm-head", choices=["heads", "tied"], default="heads",
                   help="Medusa: one LM head per head (as Medusa trains them) or the base's output embedding")
    p.add_argument("--token-input", action="store_true",
                   help="Stern heads that also read the embedding of the base's greedy next token (EAGLE's token "
                        "input): head j knows token t+1 when it drafts token t+j")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="V",
                   help="heads 2..h learn to draft among the V most frequent tokens of the training text only "
                        "(FR-Spec): their projection and loss cost V/vocabulary as much, targets outside are left "
                        "out; saves the ranking as draft_vocab.json for decode's --draft-vocab (default: all)")
    p.add_argument("--early-exit", action="store_true",
                   help="instead: one early-exit head per layer 1..d-1 for PPD (--method ppd --exit-heads DIR), "
                        "distilled from the full model")
    distill_args(p, switch=True)
    optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_heads)
    p = verbs.add_parser("adapter", help="train Kangaroo's self-drafting adapter on the base's first l layers",
                         description="Train Kangaroo's adapter (one attention layer and two norms on the states after "
                                     "layer l, the base's LM head shared) by distillation from the frozen full model; "
                                     "saves adapter.json and adapter.safetensors (decode --method kangaroo --adapter DIR).")
    p.add_argument("--base", required=True, help="base model directory (HF format; GPT-2, LLaMA or Mistral style)")
    corpus_arg(p)
    out_dir(p, ADAPTER, inputs=("base", "tokenizer", "corpus"), required=True, help="output directory")
    p.add_argument("--exit-layer", type=int, default=2, help="l: the adapter reads the states after layer l (default 2)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    optim_args(p, steps=300, lr=1e-3)
    p.set_defaults(func=_cmd_train_adapter)
    add_draft_model_parser(verbs)
