"""`roundhouse nodes`: the nodes as the scheduler leader sees them (a table, or JSON with --json).

Per node: a state word as Slurm's ``sinfo`` has them (idle, mixed, allocated, draining, drained,
silent, down), GPUs total/used/free, the jobs holding GPUs there (a user sees the ids of their own
and a count of the others), when it last spoke, and who drained it and why. ``roundhouse drain``
and ``roundhouse undrain`` change the last.

What a listing needs (the client, the schemas, NATS) is imported when the command runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from roundhouse.commands.common import cluster_command, rough_duration

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.operations import NodesReply, NodeView

HEADER = ("NODE", "STATE", "GPUS", "USED", "FREE", "TYPE", "HEARTBEAT", "JOBS", "DRAIN")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = ("List the nodes the scheduler knows: state (idle, mixed, allocated, draining, drained, silent, "
                   "down), GPUs total, used and free, the jobs on each, the age of its last heartbeat, and drains.")
    with cluster_command(subparsers, "nodes", run, description) as parser:
        parser.add_argument("node_ids", nargs="*", metavar="NODE", help="only these nodes")
        parser.add_argument("--json", action="store_true", help='print JSON: {"nodes": [...], "epoch": N, ...}')


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else f"{rough_duration(seconds, second_digits=1)} ago"


def _jobs(view: NodeView, width: int = 40) -> str:
    text = ",".join(view.jobs)
    if len(text) > width:
        text = text[: width - 3] + "..."
    if view.other_jobs:
        text = f"{text} +{view.other_jobs}" if text else f"+{view.other_jobs}"
    return text or "-"


def _drain(view: NodeView, now: float) -> str:
    if view.drained_by is not None:
        when = _ago(max(0.0, now - view.drained_at)) if view.drained_at is not None else ""
        text = f"by {view.drained_by} {when}".rstrip()
        return f"{text}: {view.drain_reason}" if view.drain_reason else text
    if view.agent_draining:
        return "agent leaving"
    return "-"


def format_table(views: list[NodeView], now: float) -> str:
    rows = [HEADER]
    for v in views:
        rows.append((v.node_id, v.state.value, str(v.gpus_total), str(v.gpus_used), str(v.gpus_free), v.gpu_type,
                     _ago(v.heartbeat_age_s), _jobs(v), _drain(v, now)))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    import json

    from roundhouse.commands.common import ask_cluster
    from roundhouse.queries import fetch_nodes

    async def ask(client: Client) -> NodesReply:
        return await fetch_nodes(client.bus, node_ids=args.node_ids)

    reply = ask_cluster(
        args, ask, nobody_answers="no scheduler is leading (nothing answers query.nodes); is its service running?"
    )
    if args.json:
        print(json.dumps(reply.model_dump(mode="json")))
    else:
        print(format_table(list(reply.nodes), time.time()))
    for node_id in reply.unknown:
        print(f"roundhouse nodes: no such node: {node_id}", file=sys.stderr)
    return 1 if reply.unknown else 0
