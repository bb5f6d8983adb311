"""`roundhouse undrain NODE`: lift an operator's drain; the node takes new work again (see ``drain.py``)."""

from __future__ import annotations

import argparse

from roundhouse.commands.common import cluster_command


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from roundhouse.commands.drain import run

    description = ("Lift an operator's drain of a node (`roundhouse drain`): the scheduler places work there "
                   "again. Operators only.")
    with cluster_command(subparsers, "undrain", run, description, drain=False) as parser:
        parser.add_argument("node_id", metavar="NODE")
