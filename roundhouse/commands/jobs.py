"""`roundhouse jobs`: list jobs as the scheduler sees them (a table, or JSON with --json).

Jobs come in queue order by default (:func:`queue_order`): queued jobs in the scheduler's order (the
last round's ranking, ``queue_position``; jobs that arrived since, by submission), then held ones,
running ones (earliest start first) and finished ones (earliest finish first). ``--status`` takes
Roundhouse's statuses and Slurm's and Kueue's words (``statuses.py``); an unknown word is an error.

START is when a job first started; for a queued job, when it is expected to start (its ETA: the
scheduler's forward simulation under the policy in force, ``eta_s`` in ``--json``), as ``in 12m
(14:05)``, ``in ~12m`` when it rests on a guessed duration (a job without ``expected_duration_s``).

What a listing needs (the client, the schemas, NATS) is imported when the command runs, not when
the CLI starts (``roundhouse --help`` and every other command stay quick).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from roundhouse.commands.common import cluster_command, rough_duration
from roundhouse.commands.statuses import FINAL, UnknownStatusError, parse_statuses, valid_words

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.control import JobsReply, JobView

SORTS = ("queue", "id", "submitted")


def _status_word(word: str) -> list[str]:
    try:
        return parse_statuses([word])
    except UnknownStatusError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = ("List jobs, in queue order unless --sort says otherwise: queued jobs in the scheduler's "
                   "order (its last round's ranking under the policy in force; jobs that arrived since, by "
                   "submission), then held jobs, running jobs (earliest start first) and finished ones (earliest "
                   "finish first).")  # fmt: skip
    with cluster_command(subparsers, "jobs", run, description) as parser:
        parser.add_argument("job_ids", nargs="*", metavar="ID", help="only these jobs")
        parser.add_argument("--all", action="store_true", help="include finished jobs")
        parser.add_argument("--user", help="only this user's jobs")
        parser.add_argument(
            "--status", action="append", default=[], type=_status_word, metavar="STATUS",
            help=f"only jobs in this status (repeatable, or comma-separated): {valid_words()}",
        )  # fmt: skip
        parser.add_argument("--sort", choices=SORTS, default="queue", help="queue (default), id or submitted")
        parser.add_argument("--limit", type=int, default=1000)
        parser.add_argument("--json", action="store_true",
                            help="print JSON: {\"jobs\": [...], \"truncated\": bool}")  # fmt: skip


def _age(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    return rough_duration(max(0.0, now - ts)) + " ago"


def _clock(ts: float, now: float) -> str:
    """A wall-clock time: ``14:05`` within a day of ``now``, else ``Nov 28 14:05``."""
    local = time.localtime(ts)
    return time.strftime("%H:%M" if abs(ts - now) < 86400 else "%b %d %H:%M", local)


def _start(job: JobView, now: float) -> str:
    """START: since when it runs (or ran), or for a queued job its ETA (module doc)."""
    if job.first_start_time is not None and job.status != "queued":
        return _age(job.first_start_time, now)
    if job.eta_s is None or job.eta_time is None:
        return _age(job.first_start_time, now)
    guessed = "~" if job.eta_quality == "guessed" else ""
    if job.eta_s < 1:
        return f"{guessed}now"
    return f"in {guessed}{rough_duration(job.eta_s)} ({_clock(job.eta_time, now)})"


def _runtime(seconds: float) -> str:
    """``1:02:03`` (hours:minutes:seconds), as ``squeue``'s TIME; days as ``2-03:04:05``."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def _group(view: JobView) -> int:
    if view.status == "queued":
        return 0
    if view.status == "held":
        return 1
    if view.status in FINAL:
        return 3
    return 2


def queue_order(views: Iterable[JobView]) -> list[JobView]:
    """Queued jobs by their place in the last round's ranking (those that arrived since after them,
    by submission), then held jobs by submission, running jobs by start, finished jobs by finish."""

    def key(view: JobView) -> tuple[int, int, float, str]:
        group = _group(view)
        if group == 0:
            position = view.queue_position
            return (group, position if position is not None else sys.maxsize, view.submit_time, view.job_id)
        if group == 1:
            return (group, 0, view.submit_time, view.job_id)
        if group == 2:
            started = view.first_start_time if view.first_start_time is not None else view.submit_time
            return (group, 0, started, view.job_id)
        return (group, 0, view.finish_time if view.finish_time is not None else view.submit_time, view.job_id)

    return sorted(views, key=key)


def ordered(views: list[JobView], sort: str) -> list[JobView]:
    if sort == "id":
        return sorted(views, key=lambda v: v.job_id)
    if sort == "submitted":
        return sorted(views, key=lambda v: (v.submit_time, v.job_id))
    return queue_order(views)


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


HEADER = ("ID", "NAME", "USER", "CLASS", "STATUS", "GPUS", "PLACEMENT", "SUBMITTED", "START", "RUNTIME", "GPU-h",
          "ITER", "PREEMPT", "REASON")  # fmt: skip


def format_table(jobs: list[JobView], now: float) -> str:
    rows = [HEADER]
    for job in jobs:
        placement = ",".join(f"{node}:{'+'.join(map(str, gpus))}" for node, gpus in job.placement.items()) or "-"
        runtime = _runtime(job.runtime_s) if job.first_start_time is not None else "-"
        gpu_hours = f"{job.attained_service_s / 3600:.2f}" if job.first_start_time is not None else "-"
        rows.append((job.job_id, job.name, job.user, job.job_class.value, job.status, str(job.gpus), placement,
                     _age(job.submit_time, now), _start(job, now), runtime, gpu_hours,
                     str(job.iterations_done), str(job.preemptions), one_line(job.reason)))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    import json

    from roundhouse.commands.common import ask_cluster
    from schemas.control import JobsQuery

    statuses = [s for words in args.status for s in words]

    async def ask(client: Client) -> JobsReply:
        query = JobsQuery(requester=client.identity, job_ids=args.job_ids, statuses=list(dict.fromkeys(statuses)),
                          user=args.user, include_finished=args.all or bool(args.job_ids), limit=args.limit)
        return await client.jobs(query)

    reply = ask_cluster(
        args, ask, nobody_answers="no scheduler is leading (nothing answers query.jobs); is its service running?",
        too_slow="no answer from the scheduler; is its service running?",
    )  # fmt: skip
    jobs = ordered(reply.jobs, args.sort)
    if args.json:
        out: dict[str, object] = {"jobs": [j.model_dump(mode="json") for j in jobs], "truncated": reply.truncated}
        if reply.refused:
            out["refused"] = dict(reply.refused)
        print(json.dumps(out))
    else:
        print(format_table(jobs, time.time()))
        if reply.truncated:
            print(f"(first {len(jobs)} jobs; use --limit or filters for more)")
    # Someone else's job named by id: the scheduler says whose, nothing more (issue 13).
    for job_id, reason in sorted(reply.refused.items()):
        print(f"roundhouse jobs: {job_id}: {reason}", file=sys.stderr)
    return 1 if reply.refused else 0
