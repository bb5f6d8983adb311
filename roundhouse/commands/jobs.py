"""`roundhouse jobs`: list jobs as the scheduler sees them (a table, or JSON with --json)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from roundhouse.client import Client
from roundhouse.commands.common import add_endpoint_flags, with_client
from schemas.control import JobsQuery, JobsReply, JobView
from services.runtime.bus import BusError, NoResponderError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("jobs", help="list jobs (a table, or --json)")
    parser.add_argument("job_ids", nargs="*", metavar="ID", help="only these jobs")
    parser.add_argument("--all", action="store_true", help="include finished jobs")
    parser.add_argument("--user", help="only this user's jobs")
    parser.add_argument("--status", action="append", default=[], help="only jobs in this status (repeatable)")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--json", action="store_true", help="print JSON: {\"jobs\": [...], \"truncated\": bool}")
    add_endpoint_flags(parser)
    parser.set_defaults(handler=run)


def _age(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, now - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def one_line(reason: str | None) -> str:
    """A reason on one table line: a failure's headline (``exit code 3 on node-0``) and the last
    line of its output, which in a traceback names the error; ``--json`` has it whole."""
    if not reason:
        return ""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    head, _, _ = lines[0].partition(": ")
    return f"{head}: {lines[-1]}"


def format_table(jobs: list[JobView], now: float) -> str:
    header = ("ID", "NAME", "USER", "CLASS", "STATUS", "GPUS", "PLACEMENT", "SUBMITTED", "ITER", "PREEMPT", "REASON")
    rows = [header]
    for job in jobs:
        placement = ",".join(f"{node}:{'+'.join(map(str, gpus))}" for node, gpus in job.placement.items()) or "-"
        rows.append((job.job_id, job.name, job.user, job.job_class.value, job.status, str(job.gpus), placement,
                     _age(job.submit_time, now) + " ago", str(job.iterations_done), str(job.preemptions),
                     one_line(job.reason)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    async def ask(client: Client) -> JobsReply:
        query = JobsQuery(requester=client.identity, job_ids=args.job_ids, statuses=args.status, user=args.user,
                          include_finished=args.all or bool(args.job_ids), limit=args.limit)
        return await client.jobs(query)

    try:
        reply = with_client(args, ask)
    except TimeoutError:
        print("roundhouse jobs: no answer from the scheduler; is its service running?", file=sys.stderr)
        return 1
    except NoResponderError:
        print("roundhouse jobs: no scheduler is leading (nothing answers query.jobs); is its service running?",
              file=sys.stderr)
        return 1
    except BusError as exc:  # the scheduler answered with an error (e.g. it stopped leading meanwhile)
        print(f"roundhouse jobs: the scheduler failed to answer: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"roundhouse jobs: cannot reach NATS: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out: dict[str, object] = {"jobs": [j.model_dump(mode="json") for j in reply.jobs], "truncated": reply.truncated}
        if reply.refused:
            out["refused"] = dict(reply.refused)
        print(json.dumps(out))
    else:
        print(format_table(reply.jobs, time.time()))
        if reply.truncated:
            print(f"(first {len(reply.jobs)} jobs; use --limit or filters for more)")
    # Someone else's job named by id: the scheduler says whose, nothing more (issue 13).
    for job_id, reason in sorted(reply.refused.items()):
        print(f"roundhouse jobs: {job_id}: {reason}", file=sys.stderr)
    return 1 if reply.refused else 0
