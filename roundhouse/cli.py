"""The `roundhouse` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from roundhouse import __version__
from roundhouse.commands import load_commands


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
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
