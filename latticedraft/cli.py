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


_GROUPS: list = []


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
