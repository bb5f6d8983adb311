"""`roundhouse drain NODE [--now]`: the node takes no new work; `roundhouse undrain NODE` lifts that.

A drained node keeps its running jobs (they finish there) unless ``--now``: then the scheduler
revokes them through the normal two-phase preemption, so each checkpoints at an iteration boundary,
queues again and resumes elsewhere. The drain is stored by the scheduler: it outlives a scheduler
restart or failover and the node's agent restarting. Operators only: a user's credentials are
refused here at once (the broker would drop the request), and the scheduler checks the requester
besides. An unknown node is an error.
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from roundhouse.commands.common import cluster_command

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.operations import DrainReply

_REMOTE_PREFIX = re.compile(r"^\S+: [A-Za-z]+Error: ")
"""``operator.drain.<who>: UnknownNodeError: `` before the scheduler's own words (``RemoteError``)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = ("Drain a node: the scheduler places no new work there; running jobs finish there unless "
                   "--now, which preempts them (each checkpoints, queues again and resumes elsewhere). Operators "
                   "only; `roundhouse undrain NODE` lifts it.")  # fmt: skip
    with cluster_command(subparsers, "drain", run, description, drain=True) as parser:
        parser.add_argument("node_id", metavar="NODE")
        parser.add_argument("--now", action="store_true", help="also preempt its running jobs (they checkpoint first)")
        parser.add_argument("--reason", help="why (shown by `roundhouse nodes`)")


def describe(reply: DrainReply) -> str:
    """What happened, in one line."""
    node = reply.node_id
    if not reply.draining:
        return f"{node} undrained: it takes new work" if reply.changed else f"{node} was not drained"
    line = f"{node} drained: it takes no new work" if reply.changed else f"{node} already drained"
    if reply.preempted:
        line += f"; preempting {', '.join(reply.preempted)} (each checkpoints and queues again)"
    return line


def run(args: argparse.Namespace) -> int:
    from roundhouse.commands.common import CommandFailed, ask_cluster, command_name
    from roundhouse.queries import DrainPermissionError, request_drain
    from services.runtime.bus import RemoteError

    async def ask(client: Client) -> DrainReply:
        try:
            return await request_drain(
                client.bus, args.node_id, drain=args.drain, now=getattr(args, "now", False),
                reason=getattr(args, "reason", None),
            )  # fmt: skip
        # Said in the scheduler's (or request_drain's) own words: a PermissionError would otherwise
        # read as "cannot reach NATS", a RemoteError as "failed to answer".
        except DrainPermissionError as exc:
            raise CommandFailed(f"{command_name(args)}: {exc}") from None
        except RemoteError as exc:  # refused: not an operator, no such node
            raise CommandFailed(f"{command_name(args)}: {_REMOTE_PREFIX.sub('', str(exc))}") from None

    reply = ask_cluster(
        args, ask, nobody_answers="no scheduler is leading (nothing answers operator.drain); is its service running?"
    )
    print(describe(reply))
    return 0
