"""``latticedraft <group> <verb>``: parses arguments, calls the library, prints results.

Thin by design: no algorithm lives here. One module per command (``decode``, ``eval``, ``tune``,
``demo``, ``train``, ``lm``, ``rescore``, ``lattice``, ``export``, ``import_``, ``fetch``), each with an ``add_parser(groups)`` that
registers its arguments and the function that runs it; every command is a function
``(args) -> int``. Before it runs, every output the command declared goes through the overwrite rule
(``output_options.claim_outputs``). User errors (``LatticedraftError``) print as one line
``error: ...`` and exit with status 2; usage errors as ``error: ...`` and one ``see: ... --help``
line. The libraries' own warnings and notices stay off stderr unless ``--verbose`` (before or after
the command: ``latticedraft --verbose decode ...``, ``latticedraft decode --verbose ...``).
"""

from __future__ import annotations

import argparse
import sys

from latticedraft.cli import decode, demo, export, fetch, import_, lattice, lm, rescore, train, tune
from latticedraft.cli import eval as evaluate
from latticedraft.cli.parser import Parser, finish
from latticedraft.errors import LatticedraftError
from latticedraft.quiet import add_verbose_arg, quiet_libraries

_GROUPS = (train, lm, decode, evaluate, tune, demo, rescore, lattice, import_, export, fetch)


def description() -> str:
    """What ``latticedraft --help`` says latticedraft is (the approximate methods from the registry)."""
    from latticedraft.decoding import registry

    lossy = [m.name for m in registry.methods().values() if not m.lossless]
    return ("Faster language-model decoding without changing the output. Draft sources (multi-token heads and "
            "their lattices rescored with n-gram or neural LMs, context n-grams, the model's own weights at 4 bits, "
            "a draft model, the model's own early layers, a lookahead window) propose several tokens per step; the model verifies them in one "
            "forward pass and keeps exactly what greedy decoding would write, or with sampling draws from its own "
            f"distribution ({' and '.join(lossy)} sample approximately). latticedraft also trains the heads and "
            "draft models and builds the n-gram LMs they use.")


def build_parser() -> argparse.ArgumentParser:
    from latticedraft import __version__

    parser = Parser(prog="latticedraft", description=description())
    parser.add_argument("--version", action="version", version=f"latticedraft {__version__}")
    add_verbose_arg(parser, dest="verbose_all")
    groups = parser.add_subparsers(dest="group", required=True, metavar="<group>")
    for command in _GROUPS:
        command.add_parser(groups)
    return finish(parser)  # each command's --verbose, and what cli_checks.given compares against


decode_options = decode.decode_options  # (Method, options) of `latticedraft decode ARGV`, for benchmarks


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_libraries(verbose=args.verbose or args.verbose_all)
    try:
        from latticedraft.textin import check_text_value

        from latticedraft.cli.output_options import claim_outputs

        for dest in ("prompt", "text"):
            check_text_value(getattr(args, dest, None), f"--{dest}")
        claim_outputs(args)  # the overwrite rule for every declared output, before the command starts
        return int(args.func(args) or 0)
    except LatticedraftError as e:
        print("error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except OSError as e:  # the file system refused: a path the user gave, named by the OS
        where = f" {e.filename}" if e.filename else ""
        print(f"error:{where}: {e.strerror or e}; check the path and its permissions", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # what was kept and how to continue (interrupts.keeping)
        from latticedraft.interrupts import message

        print("error: " + message(e), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
