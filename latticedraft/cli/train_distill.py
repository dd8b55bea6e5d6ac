"""Self-distillation options of ``latticedraft train``: ``train heads --self-distill`` and ``train draft-model``.

Kept apart from ``train.py``: ``distill_args`` adds the options to a parser, ``distill_config``
turns them into a ``DistillConfig``, ``add_draft_model_parser`` registers ``train draft-model``.
"""

from __future__ import annotations

import argparse

from latticedraft.cli.args import stdin_corpus
from latticedraft.errors import InputError

# the options that say how the base's continuations are made and which loss is used
DISTILL_OPTIONS = ("distill_text", "distill_loss", "distill_prompts", "prompt_len", "sample_fraction",
                   "distill_temperature", "gen_batch_size", "distill_chat", "question_tokens", "distill_engine")


def distill_args(p: argparse.ArgumentParser, switch: bool) -> None:
    """The self-distillation options; ``switch``: add ``--self-distill`` (``train heads``), else
    distillation is what the command does (``train draft-model``)."""
    g = p.add_argument_group("self-distillation (targets are the base's own predictions: Medusa-2, EAGLE)")
    if switch:
        g.add_argument("--self-distill", action="store_true",
                       help="train on the base's own continuations of corpus prompts, each head j learning the base's "
                            "distribution of token t+j (KL divergence); the options below refine it")
    g.add_argument("--distill-text", choices=["continuations", "corpus"], default="continuations",
                   help="training text: the base's continuations of corpus prompts (default) or the corpus itself")
    g.add_argument("--distill-loss", choices=["kl", "hard"], default="kl",
                   help="kl: KL divergence to the frozen base's distribution (default); hard: cross-entropy on the "
                        "text's own tokens")
    g.add_argument("--distill-prompts", type=int, default=1024,
                   help="corpus prompts the base continues (rows of --seq-len tokens; default 1024)")
    g.add_argument("--prompt-len", type=int, default=48, help="corpus tokens per prompt (default 48); the base "
                                                              "continues each to --seq-len tokens")
    g.add_argument("--sample-fraction", type=float, default=0.5,
                   help="share of the rows sampled at --distill-temperature, the rest greedy (default 0.5)")
    g.add_argument("--distill-temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    g.add_argument("--gen-batch-size", type=int, default=16,
                   help="rows the decode loop continues together (default 16); the rows are cached under "
                        ".cache/continuations and a killed run keeps the finished batches")
    g.add_argument("--distill-chat", type=float, default=0.0,
                   help="share of the prompts that are chat questions the base writes itself (its chat template's "
                        "user turn, sampled at --distill-temperature; no data set), answered as --chat decodes "
                        "them; the rest are corpus prompts (default 0)")
    g.add_argument("--question-tokens", type=int, default=48,
                   help="longest question the base writes for --distill-chat, in tokens (default 48)")
    g.add_argument("--distill-engine", choices=["loop", "plain"], default="loop",
                   help="what continues the prompts: loop, latticedraft's decode loop (default); plain, the base's "
                        "forward over a left-padded batch, many times faster on a GPU (greedy rows equal the loop's "
                        "up to the kernels' rounding; a sampled row depends on its batch)")


def distill_config(a):
    """The ``DistillConfig`` of the parsed options, or None for ``train heads`` without ``--self-distill``
    (then none of the distillation options may be given)."""
    from latticedraft.cli.checks import refuse_given
    from latticedraft.decoding.runs.continuations import ENGINES
    from latticedraft.gpu.train.continuations import ContinuationSpec
    from latticedraft.gpu.train.distill import DistillConfig

    if not getattr(a, "self_distill", True):
        refuse_given(a, DISTILL_OPTIONS, "it refines --self-distill")
        return None
    spec = ContinuationSpec(prompts=a.distill_prompts, prompt_len=a.prompt_len, seq_len=a.seq_len,
                            sample_fraction=a.sample_fraction, temperature=a.distill_temperature, seed=a.seed,
                            batch_size=a.gen_batch_size, chat_fraction=a.distill_chat,
                            question_tokens=a.question_tokens)
    if a.distill_text == "corpus":
        refuse_given(a, ("distill_prompts", "prompt_len", "sample_fraction", "distill_temperature", "gen_batch_size",
                         "distill_chat", "question_tokens", "distill_engine"),
                     "--distill-text corpus makes no continuations")
    cfg = DistillConfig(text=a.distill_text, loss=a.distill_loss, continuation=spec, decoder=ENGINES[a.distill_engine])
    cfg.validate()
    return cfg


def _cmd_train_draft_model(a) -> int:
    from latticedraft.cli.train_checks import check_training, check_training_memory, optim_config, print_trained
    from latticedraft.gpu.train import footprint
    from latticedraft.gpu.train.draft_model import DraftArch, train_draft_model
    from latticedraft.lm.corpus import resolve_corpus

    arch = DraftArch(n_layer=a.n_layer, n_embd=a.n_embd, n_head=a.n_head, ffn_dim=a.ffn_dim)
    arch.validate()
    if a.assistant_tokens < 1:
        raise InputError(f"--assistant-tokens {a.assistant_tokens} must be at least 1")
    distill = distill_config(a)
    base = check_training(a, base_dir=a.base)
    sizes = {"--n-embd": a.n_embd, "--n-layer": a.n_layer, "--batch-size": a.batch_size, "--seq-len": a.seq_len}
    if a.ffn_dim is not None:
        sizes["--ffn-dim"] = a.ffn_dim
    check_training_memory(a, sizes, lambda s: footprint.draft_model_bytes(
        base, s["--n-embd"], s["--n-layer"], s.get("--ffn-dim", -(-base.ffn * s["--n-embd"] // base.hidden)),
        s["--batch-size"], s["--seq-len"]))
    with stdin_corpus(a.corpus) as corpus:
        files = resolve_corpus(corpus)
        res = train_draft_model(a.base, files, a.out, arch, optim_config(a), distill, tokenizer_path=a.tokenizer,
                                resume=a.resume, save_dtype=a.save_dtype, device=a.device,
                                encoding_errors=a.encoding_errors, stop_after=a.stop_after, init=a.init,
                                assistant_tokens=a.assistant_tokens, force=a.force)
    return print_trained(res, "final")


def add_draft_model_parser(verbs) -> None:
    """Register ``train draft-model``."""
    from latticedraft.cli.output_options import out_dir
    from latticedraft.cli.train_checks import corpus_arg, optim_args
    from latticedraft.outputs import DRAFT_MODEL

    p = verbs.add_parser("draft-model", help="distil a small draft model of the base's architecture from the base",
                         description="Distil a small causal LM of the base's own architecture, vocabulary and tokenizer "
                                     "from a frozen base: it learns the base's next-token distribution (KL divergence) "
                                     "on the base's own continuations of corpus prompts (--distill-text corpus and "
                                     "--distill-loss hard change the text and the loss). The result drafts for "
                                     "--drafter model, --method mtad and HF assisted generation, and rescores for "
                                     "--drafter neural. Checkpoints every --checkpoint-every steps; --resume continues.")
    p.add_argument("--base", required=True, help="base model directory (HF format; its tokenizer.json is used)")
    corpus_arg(p)
    out_dir(p, DRAFT_MODEL, inputs=("base", "tokenizer", "corpus"), required=True, help="output directory (HF format)")
    p.add_argument("--n-layer", type=int, default=1, help="decoder layers (default 1)")
    p.add_argument("--n-embd", type=int, default=64, help="hidden size (default 64)")
    p.add_argument("--n-head", type=int, default=4, help="attention heads per layer (default 4)")
    p.add_argument("--ffn-dim", type=int, default=None,
                   help="feed-forward width (default: the base's ratio to its hidden size, times --n-embd)")
    p.add_argument("--init", choices=["base", "random"], default="base",
                   help="base: start from what fits of the base (its embeddings, projected onto their top principal "
                        "directions when narrower; at the base's width also its final norm and evenly spaced layers); "
                        "random: the config's own initialisation (default base)")
    p.add_argument("--assistant-tokens", type=int, default=5,
                   help="drafted tokens per round that generation_config.json asks of HF assisted generation, on its "
                        "heuristic schedule (default 5)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: BASE/tokenizer.json)")
    distill_args(p, switch=False)
    optim_args(p, steps=600, lr=3e-3)
    p.set_defaults(func=_cmd_train_draft_model)
