"""`roundhouse status`: the control plane at a glance (a summary, or JSON with --json).

The leader and its epoch; every service instance that answers the NATS services API in this
namespace, with the policy and options it runs (a standby started with another policy shows here
before it could take over with it); the last round's number and phase timings; the queue's depth;
nodes and GPUs. The scheduler leader gathers it (``query.status``), so users may ask too.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from roundhouse.commands.common import cluster_command, rough_duration

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.operations import StatusReply

_PHASES = ("snapshot", "rank", "encode", "publish", "placement", "apply", "grants_acked", "cpu")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = ("Show the scheduler leader and its epoch, each service's instances with the policy and options "
                   "they run, the last round's phase timings, the queue's depth, and nodes and GPUs.")
    with cluster_command(subparsers, "status", run, description) as parser:
        parser.add_argument("--json", action="store_true", help="print the scheduler's StatusReply as JSON")


def _uptime(seconds: float | None) -> str:
    return "-" if seconds is None else rough_duration(seconds)


def format_status(reply: StatusReply) -> str:
    queue, rnd = reply.queue, reply.round
    lines = [
        f"leader    {reply.leader} (epoch {reply.epoch})",
        f"queue     {queue.queued} queued ({queue.queued_gpus} GPUs), {queue.held} held, {queue.running} running",
        f"nodes     {reply.nodes} registered, {reply.nodes_taking_work} taking work; "
        f"GPUs {reply.gpus_used} of {reply.gpus_total} used",
    ]
    if rnd.rounds_run:
        phases = ", ".join(f"{k} {rnd.phases_s[k] * 1000:.1f} ms" for k in _PHASES if k in rnd.phases_s)
        lines.append(f"round     #{rnd.number} ({rnd.rounds_run} this term, {rnd.policy}): launched {rnd.launched}, "
                     f"suspended {rnd.suspended}, dropped {rnd.dropped}")  # fmt: skip
        lines.append(f"phases    {phases}")
    else:
        lines.append("round     none yet in this term")
    rows = [("SERVICE", "INSTANCE", "VERSION", "UPTIME", "POLICY", "OPTIONS")]
    for service in reply.services:
        for i in service.instances:
            name = f"{i.instance} (leader)" if i.leader else i.instance
            options = json.dumps(i.policy_options, separators=(",", ":")) if i.policy_options else "-"
            rows.append((service.kind, name, i.version, _uptime(i.uptime_s), i.policy or "-", options))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines.append("")
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from roundhouse.commands.common import ask_cluster
    from roundhouse.queries import fetch_status

    async def ask(client: Client) -> StatusReply:
        return await fetch_status(client.bus)

    reply = ask_cluster(
        args, ask, nobody_answers="no scheduler is leading (nothing answers query.status); is its service running?"
    )
    print(json.dumps(reply.model_dump(mode="json")) if args.json else format_status(reply))
    return 0
