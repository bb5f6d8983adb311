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
import sys
from typing import TYPE_CHECKING

from roundhouse.commands.common import add_endpoint_flags

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.operations import DrainReply

_REMOTE_PREFIX = re.compile(r"^\S+: [A-Za-z]+Error: ")
"""``operator.drain.<who>: UnknownNodeError: `` before the scheduler's own words (``RemoteError``)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "drain", help="drain a node: no new work there (--now: preempt its jobs with checkpoints)",
        description="Drain a node: the scheduler places no new work there; running jobs finish there unless "
        "--now, which preempts them (each checkpoints, queues again and resumes elsewhere). Operators only; "
        "`roundhouse undrain NODE` lifts it.",
    )  # fmt: skip
    parser.add_argument("node_id", metavar="NODE")
    parser.add_argument("--now", action="store_true", help="also preempt its running jobs (they checkpoint first)")
    parser.add_argument("--reason", help="why (shown by `roundhouse nodes`)")
    add_endpoint_flags(parser)
    parser.set_defaults(handler=run, drain=True)


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
    from roundhouse.commands.common import with_client
    from roundhouse.queries import DrainPermissionError, request_drain
    from services.runtime.bus import BusError, NoResponderError, RemoteError

    verb = "drain" if args.drain else "undrain"

    async def ask(client: Client) -> DrainReply:
        return await request_drain(
            client.bus, args.node_id, drain=args.drain, now=getattr(args, "now", False),
            reason=getattr(args, "reason", None),
        )  # fmt: skip

    try:
        reply = with_client(args, ask)
    except DrainPermissionError as exc:
        print(f"roundhouse {verb}: {exc}", file=sys.stderr)
        return 1
    except (TimeoutError, NoResponderError):
        print(f"roundhouse {verb}: no scheduler is leading (nothing answers operator.drain); is its service running?",
              file=sys.stderr)  # fmt: skip
        return 1
    except RemoteError as exc:  # refused: not an operator, no such node
        print(f"roundhouse {verb}: {_REMOTE_PREFIX.sub('', str(exc))}", file=sys.stderr)
        return 1
    except BusError as exc:
        print(f"roundhouse {verb}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"roundhouse {verb}: cannot reach NATS: {exc}", file=sys.stderr)
        return 1
    print(describe(reply))
    return 0
