"""`roundhouse history --trace FILE`: the cluster's finished jobs as a trace the simulator replays.

A team can ask how its own workload would have fared under other policies: export what the cluster
ran, then ``roundhouse simulate --trace FILE --format roundhouse --scheduler ...``. The rows are
Roundhouse's trace CSV (``roundhouse.sim.traces``, docs/simulator.md), one per completed job in
submission order:

``arrival_s``
    seconds after the first exported job's submission (the scheduler's ``submit_time``);
``gpus``
    GPUs requested;
``duration_s``
    the job's run time without its queueing: the seconds it held GPUs over all its runs
    (``runtime_s``; a preempted job's includes its checkpoint and restart time);
``class``, ``user``
    as submitted;
``model``
    the spec's model hint, empty without one (the simulator then uses its default costs).

Jobs come from the scheduler's jobs query (as ``roundhouse jobs --all --json``): a user gets their
own, an operator everyone's (``--user`` narrows that). Failed and cancelled jobs are left out (their
run time is not the work a replay should do). ``--time-scale X`` multiplies every time (an emulated
cluster at ``--speedup X`` runs traces X times faster than their durations).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from roundhouse.commands.common import cluster_command

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.control import JobView

COLUMNS: tuple[str, ...] = ("arrival_s", "gpus", "duration_s", "class", "user", "model")
PAGE = 1000


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = ("Write the cluster's completed jobs (yours; an operator's: everyone's) in the simulator's "
                   "trace format, so `roundhouse simulate --trace FILE --format roundhouse` replays them under "
                   "other policies.")  # fmt: skip
    with cluster_command(subparsers, "history", run, description) as parser:
        parser.add_argument("--trace", type=Path, required=True, metavar="FILE", help="CSV to write ('-': stdout)")
        parser.add_argument("--user", help="only this user's jobs")
        parser.add_argument("--limit", type=int, default=100_000,
                            help="at most this many jobs (the earliest submitted)")  # fmt: skip
        parser.add_argument(
            "--time-scale", type=float, default=1.0, metavar="X",
            help="multiply every time by X (an emulated cluster's --speedup gives the trace's own seconds)",
        )  # fmt: skip


def trace_rows(views: Iterable[JobView], time_scale: float = 1.0) -> list[dict[str, str]]:
    """The completed jobs among ``views`` as trace rows, in submission order, arrivals relative to the first."""
    done = sorted((v for v in views if v.status == "completed"), key=lambda v: (v.submit_time, v.job_id))
    if not done:
        return []
    first = done[0].submit_time
    return [
        {
            "arrival_s": _seconds((view.submit_time - first) * time_scale),
            "gpus": str(view.gpus),
            "duration_s": _seconds(view.runtime_s * time_scale),
            "class": view.job_class.value,
            "user": view.user,
            "model": view.model or "",
        }
        for view in done
    ]


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def write_trace(rows: Sequence[dict[str, str]], out: Path) -> None:
    import csv

    if str(out) == "-":
        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


async def finished_jobs(client: Client, user: str | None, limit: int) -> list[JobView]:
    """Every completed job the requester may read (pages of ``PAGE`` by job id), at most ``limit``."""
    from schemas.control import JobsQuery

    views: list[JobView] = []
    after: str | None = None
    while True:
        query = JobsQuery(requester=client.identity, statuses=["completed"], user=user, include_finished=True,
                          after=after, limit=PAGE)  # fmt: skip
        reply = await client.jobs(query)
        views.extend(reply.jobs)
        if not reply.truncated or not reply.jobs:
            break
        after = max(view.job_id for view in reply.jobs)
    views.sort(key=lambda v: (v.submit_time, v.job_id))
    return views[:limit]


def run(args: argparse.Namespace) -> int:
    from roundhouse.commands.common import ask_cluster

    if not args.time_scale > 0 or args.limit < 1:
        print("roundhouse history: --time-scale must be > 0 and --limit >= 1", file=sys.stderr)
        return 2

    async def ask(client: Client) -> list[JobView]:
        return await finished_jobs(client, args.user, args.limit)

    views = ask_cluster(args, ask, nobody_answers="no scheduler is leading (nothing answers query.jobs)",
                        too_slow="no answer from the scheduler; is its service running?")  # fmt: skip
    rows = trace_rows(views, args.time_scale)
    if not rows:
        print("roundhouse history: no completed jobs to export", file=sys.stderr)
        return 1
    try:
        write_trace(rows, args.trace)
    except OSError as exc:
        print(f"roundhouse history: cannot write {args.trace}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if str(args.trace) != "-":
        print(f"{len(rows)} jobs written to {args.trace}; replay: roundhouse simulate --trace {args.trace} "
              f"--format roundhouse", file=sys.stderr)  # fmt: skip
    return 0
