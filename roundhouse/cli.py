"""The `roundhouse` console script.

Only the command being run is imported (``roundhouse.commands.COMMANDS`` lists the others with
their help line), so ``roundhouse --help`` and a command's start cost a fraction of importing every
command would (``benchmarks/cli.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from roundhouse.commands import BY_NAME, COMMANDS
from roundhouse.commands.common import CommandFailed


def _version() -> str:
    from services.runtime.version import __version__

    return __version__


class _VersionAction(argparse.Action):
    """``--version``, reading the installed version only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        parser.exit(message=f"roundhouse {_version()}\n")


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names: its first word that is not an option (ours take no values)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv``, only the command it names is imported and registered in full
    (the others are listed by name and help); without, every command is."""
    parser = argparse.ArgumentParser(
        prog="roundhouse",
        description="Roundhouse: a GPU cluster scheduler for deep-learning training.",
    )
    parser.add_argument("--version", action=_VersionAction)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = None if argv is None else command_of(argv)
    for command in COMMANDS:
        if argv is None or command.name == wanted:
            command.load().register(subparsers)
        else:
            subparsers.add_parser(command.name, help=command.help)
    return parser


NEEDS_AIOHTTP = frozenset({"dashboard"})
"""Commands that serve HTTP with aiohttp; every other one runs without it (:func:`_skip_aiohttp`)."""


def _skip_aiohttp(command: str | None) -> None:
    """Keep aiohttp out of a command that does not serve the dashboard.

    nats-py imports aiohttp at start-up whenever it is installed, only for WebSocket connections
    (``nats/aio/transport.py``), which Roundhouse never makes; since the dashboard made aiohttp a
    dependency that import was ~40% of ``roundhouse jobs``'s start-up (``benchmarks/cli.py``).
    Marking it absent makes nats-py take its no-aiohttp path. Only a command-line run does this
    (``main()`` without ``argv``): a program that calls ``main([...])`` keeps its imports as they are.
    """
    if command not in NEEDS_AIOHTTP and "aiohttp" not in sys.modules:
        sys.modules["aiohttp"] = None  # type: ignore[assignment]


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        _skip_aiohttp(command_of(sys.argv[1:]))
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is a command line for the job (`roundhouse submit -- python x.py
    # --lr 0.1`), never options of ours; argparse's REMAINDER would also swallow our own options.
    trailing: list[str] = []
    if "--" in argv and (argv[0] if argv else "") != "service":
        cut = argv.index("--")
        argv, trailing = argv[:cut], argv[cut + 1 :]
    parser = build_parser(argv if command_of(argv) in BY_NAME else [])
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
