"""The `roundhouse` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from roundhouse import __version__
from roundhouse.commands import load_commands
from roundhouse.commands.common import CommandFailed


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roundhouse",
        description="Roundhouse: a GPU cluster scheduler for deep-learning training.",
    )
    parser.add_argument("--version", action="version", version=f"roundhouse {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in load_commands():
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is a command line for the job (`roundhouse submit -- python x.py
    # --lr 0.1`), never options of ours; argparse's REMAINDER would also swallow our own options.
    trailing: list[str] = []
    if "--" in argv and (argv[0] if argv else "") != "service":
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.trailing = trailing
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code: int = handler(args)
    except CommandFailed as exc:
        print(exc, file=sys.stderr)
        return exc.code
    return code


if __name__ == "__main__":
    sys.exit(main())
