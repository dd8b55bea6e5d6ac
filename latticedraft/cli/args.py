"""Option groups shared by several commands (model, drafting, tree, sampling, lookahead, self-drafting), token-id options and standard-input corpora."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

DTYPES = ("float32", "bfloat16", "float16")  # the weights' dtypes every --dtype / --save-dtype offers


def common_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="DIR", help="BPD head checkpoint or HF causal LM (default data/heads-stern)")
    p.add_argument("--tokenizer", default=None, metavar="PATH", help="tokenizer.json (default: beside the model, else data/tokenizer)")
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; 1 is fastest for tiny models on a busy CPU)")


def dtype_arg(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the weights the model decodes in (decode only: the demo, eval and tune compare with
    float32 greedy, which half precision leaves at near-ties)."""
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="the model's weights (default float32). In bfloat16/float16 a kept token is the argmax of "
                        "the verify forward, which rounds differently from generate's one-token steps: at near-ties "
                        "the output can leave generate's (docs/half-precision.md)")


def drafter_args(p: argparse.ArgumentParser) -> None:
    """``--method bpd``'s drafting options: those ``DrafterSpec`` declares, the files they read, ``--verify``."""
    from latticedraft.decoding.methods.bpd import DrafterSpec
    from latticedraft.decoding.registry import add_options

    g = p.add_argument_group("drafting (--method bpd)")
    add_options(g, DrafterSpec, "drafting")
    g.add_argument("--lm", default=None, metavar="DIR", help="n-gram LM build (default: the bundled 4-gram)")
    g.add_argument("--rescorer", default=None, metavar="DIR", help="neural rescorer (default data/rescorer-small)")
    g.add_argument("--verify", default="auto", choices=["auto", "tree", "batched"],
                   help="tree attention or drafts as batch rows (default auto: tree where the model takes 4-D masks)")


def tree_args(p: argparse.ArgumentParser) -> None:
    """Which nodes each step verifies and the draft sources beside the drafter (decode; eval has the
    sources alone, ``source_args``, for its "Base + source" rows)."""
    from latticedraft.decoding.methods.bpd import DrafterSpec
    from latticedraft.decoding.registry import add_options

    g = p.add_argument_group("draft tree (--method bpd)")
    add_options(g, DrafterSpec, "tree")
    g.add_argument("--lookahead-pool", action="store_true",
                   help="also run a lookahead Jacobi window in each verify call and add its n-gram pool's "
                        "paths for the last token to the tree (sizes from --window/--ngram/--pool)")


def source_args(p: argparse.ArgumentParser, title: str) -> None:
    """The draft sources' options alone (``decoding/sources.py``'s declarations, as ``decode`` has
    them in its tree group), in a group called ``title``."""
    from latticedraft.decoding.methods.bpd import DrafterSpec
    from latticedraft.decoding.registry import add_options
    from latticedraft.decoding.sources import sources

    add_options(p.add_argument_group(title), DrafterSpec, "tree", only=tuple(s.dest for s in sources()))


def mtad_args(p: argparse.ArgumentParser) -> None:
    """The auxiliary draft model and MTAD's options (as ``MtadOptions`` declares them)."""
    from latticedraft.decoding.methods.mtad import MtadOptions
    from latticedraft.decoding.registry import add_options

    g = p.add_argument_group("auxiliary draft model (--drafter model, --method mtad)")
    g.add_argument("--draft-model", default=None, metavar="DIR",
                   help="a small causal LM with the target's tokenizer that drafts (e.g. data/rescorer-medium)")
    add_options(g, MtadOptions, "mtad")


def gamma_arg(p: argparse.ArgumentParser) -> None:
    """``--gamma``, which three methods read, each with its own default (its options' field)."""
    from latticedraft.decoding.methods.bpd import DrafterSpec
    from latticedraft.decoding.methods.kangaroo import KangarooOptions
    from latticedraft.decoding.methods.mtad import MtadOptions

    p.add_argument("--gamma", type=int, default=None,
                   help=f"most tokens drafted per step: by the draft model (--drafter model, default "
                        f"{DrafterSpec.gamma}; --method mtad, default {MtadOptions.gamma}) or by Kangaroo's adapter "
                        f"(--method kangaroo; default {KangarooOptions.gamma})")


def lookahead_args(p: argparse.ArgumentParser) -> None:
    """Lookahead's options, as ``LookaheadOptions`` declares them, and its tuned-settings file."""
    from latticedraft.decoding.methods.lookahead import LookaheadOptions
    from latticedraft.decoding.registry import add_options

    g = p.add_argument_group("lookahead decoding (--method lookahead)")
    add_options(g, LookaheadOptions, "lookahead")
    g.add_argument("--lookahead-config", default=None, metavar="FILE.json",
                   help="W, N, G (and --prompt-as-reference) chosen by `latticedraft tune --method lookahead`")


def early_layer_args(p: argparse.ArgumentParser) -> None:
    """Kangaroo's and PPD's options, as ``KangarooOptions`` and ``PPDOptions`` declare them."""
    from latticedraft.decoding.methods.kangaroo import KangarooOptions
    from latticedraft.decoding.methods.ppd import PPDOptions
    from latticedraft.decoding.registry import add_options

    g = p.add_argument_group("early-layer self-drafting (--method kangaroo / ppd)")
    add_options(g, KangarooOptions, "self-draft")
    add_options(g, PPDOptions, "self-draft")


def sampling_args(p: argparse.ArgumentParser) -> None:
    """``--do-sample`` and generate's sampling flags as ``registry.SamplingSettings`` declares them,
    each with the methods' defaults (``--method bpd`` and ``lookahead`` sample with ``--do-sample``;
    ``mtad`` and ``dynamo`` always)."""
    from latticedraft.decoding import registry

    g = p.add_argument_group("sampling (--do-sample: as generate(do_sample=True), same meanings and defaults)")
    g.add_argument("--do-sample", action="store_true",
                   help="sample instead of decoding greedily; --method bpd and lookahead sample losslessly "
                        "(the output has the target's sampling distribution and, for a seed, the same tokens "
                        "whatever the drafter or batch)")
    registry.add_options(g, registry.SamplingSettings, "sampling", notes=sampling_notes(registry.methods().values()))


def sampling_notes(methods) -> dict:
    """dest -> " (default D; mtad D', ...)": each sampling flag's default (generate's) and the
    methods whose own default differs (``Method.defaults``); ``--seed`` states its own."""
    import dataclasses

    from latticedraft.decoding.registry import SamplingSettings

    out = {}
    for f in dataclasses.fields(SamplingSettings):
        if f.name != "seed":
            own = "".join(f"; {m.name} {m.defaults[f.name]}" for m in methods
                          if m.defaults.get(f.name, f.default) != f.default)
            out[f.name] = f" (default {f.default}{own})"
    return out


def dynamo_args(p: argparse.ArgumentParser) -> None:
    """DynaMo's own options, as ``DynamoOptions`` declares them (it samples with generate's flags,
    ``sampling_args``)."""
    from latticedraft.decoding.methods.dynamo import DynamoOptions
    from latticedraft.decoding.registry import add_options

    add_options(p.add_argument_group("DynaMo sampling (--method dynamo)"), DynamoOptions, "dynamo")


def parse_ids(values, opt: str = "token ids") -> list[int] | None:
    """Token ids as typed after ``opt``, one spelling everywhere: ``12,7,99``, ``12 7 99`` or
    ``"12 7 99"`` (``values`` is argparse's list of words, or one string) -> [12, 7, 99]; None stays None."""
    if values is None:
        return None
    text = " ".join(values) if isinstance(values, (list, tuple)) else str(values)
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        from latticedraft.errors import InputError

        raise InputError(f"{opt} {text!r}: token ids must be integers separated by commas or spaces, "
                         "e.g. 12,7,99 or 12 7 99") from None


def add_ids(p, flag: str, help: str, default=None) -> None:
    """An option taking token ids, space- or comma-separated (see ``parse_ids``)."""
    p.add_argument(flag, nargs="*", default=default, metavar="ID", help=help + "; space- or comma-separated")


@contextlib.contextmanager
def stdin_corpus(specs: list[str]):
    """``specs`` with ``-`` replaced by a temporary copy of standard input (``stdin.txt``)."""
    if "-" not in specs:
        yield list(specs)
        return
    import tempfile

    from latticedraft.textin import read_bytes_arg

    with tempfile.TemporaryDirectory(prefix="latticedraft-stdin-") as d:
        f = Path(d) / "stdin.txt"
        f.write_bytes(read_bytes_arg("-", "--corpus", "pipe the corpus text into --corpus -"))
        yield [str(f) if x == "-" else x for x in specs]


def set_threads(a) -> None:
    """Apply ``--threads`` where no ``Session`` does it (the DynaMo commands)."""
    if getattr(a, "threads", None) is not None:
        import torch

        torch.set_num_threads(a.threads)


def method_arg(p: argparse.ArgumentParser) -> None:
    """``--method``: every registered decoding method, its one-line summary in the help."""
    from latticedraft.decoding import registry

    table = registry.methods()
    p.add_argument("--method", default="bpd", choices=list(table),
                   help="; ".join(f"{name}: {m.summary}" for name, m in table.items()) + " (default bpd)")
