"""`roundhouse undrain NODE`: lift an operator's drain; the node takes new work again (see ``drain.py``)."""

from __future__ import annotations

import argparse

from roundhouse.commands.common import add_endpoint_flags


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from roundhouse.commands.drain import run

    parser = subparsers.add_parser(
        "undrain", help="undrain a node: it takes new work again",
        description="Lift an operator's drain of a node (`roundhouse drain`): the scheduler places work there "
        "again. Operators only.",
    )  # fmt: skip
    parser.add_argument("node_id", metavar="NODE")
    add_endpoint_flags(parser)
    parser.set_defaults(handler=run, drain=False)
