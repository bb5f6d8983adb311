"""`roundhouse cancel ID...`: ask the scheduler to stop jobs (running ones checkpoint first).

Only a job's owner or an operator may cancel it. The scheduler enforces that when it applies the
cancel (a refused cancel changes nothing); this command first asks it (``query.jobs`` as this
identity) which of the jobs exist and may be cancelled, so that a refusal is told to the user
(``roundhouse cancel: permission denied: bob cannot cancel alice's job j-1``, exit code 1) rather than
dropped silently, and publishes the cancel of the allowed ones only. An unknown job (``no such job:
j-9``) and a finished one (``j-1 already completed; nothing to cancel``) are errors too (issue 14).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from roundhouse.commands.common import cluster_command
from roundhouse.commands.statuses import FINAL

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.control import JobsReply


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    with cluster_command(subparsers, "cancel", run, description=None) as parser:
        parser.add_argument("job_ids", nargs="+", metavar="ID")
        parser.add_argument("--reason", help="recorded with the cancellation")


@dataclass(slots=True)
class Outcome:
    """What became of each job id asked for."""

    requested: list[str] = field(default_factory=list)
    finished: dict[str, str] = field(default_factory=dict)
    """Job id -> its final status: nothing to cancel."""
    errors: list[str] = field(default_factory=list)
    """One message per job that was not cancelled: refused, or no such job."""
    unchecked: bool = False
    """No scheduler answered the check: the cancels were published all the same (it enforces them)."""


def judge(job_ids: list[str], reply: JobsReply | None) -> tuple[list[str], Outcome]:
    """Which of ``job_ids`` to cancel, given the scheduler's answer (None: no scheduler answered)."""
    outcome = Outcome(unchecked=reply is None)
    if reply is None:
        return list(dict.fromkeys(job_ids)), outcome
    views = {view.job_id: view for view in reply.jobs}
    allowed: list[str] = []
    for job_id in dict.fromkeys(job_ids):
        view = views.get(job_id)
        if job_id in reply.refused:
            # "permission denied: bob cannot read alice's job": the same right as to cancel it.
            outcome.errors.append(f"{reply.refused[job_id].replace(' cannot read ', ' cannot cancel ')} {job_id}")
        elif view is None:
            outcome.errors.append(f"no such job: {job_id}")
        elif view.status in FINAL:
            outcome.finished[job_id] = view.status
        else:
            allowed.append(job_id)
    return allowed, outcome


def run(args: argparse.Namespace) -> int:
    from roundhouse.commands.common import ask_cluster
    from schemas.control import JobsQuery
    from services.runtime.bus import NoResponderError

    async def cancel(client: Client) -> Outcome:
        job_ids: list[str] = list(args.job_ids)
        query = JobsQuery(requester=client.identity, job_ids=job_ids, include_finished=True, limit=len(job_ids))
        try:
            reply: JobsReply | None = await client.jobs(query)
        except (NoResponderError, TimeoutError):
            reply = None  # no scheduler leads now: the durable cancel waits for one, which checks it
        allowed, outcome = judge(job_ids, reply)
        for job_id in allowed:
            await client.cancel(job_id, reason=args.reason)
        outcome.requested = allowed
        return outcome

    # No scheduler answering the check is not a failure (above); what can still time out is NATS
    # storing the cancel itself.
    outcome = ask_cluster(args, cancel, nobody_answers="NATS did not store the cancel; is the cluster running?")
    return report(outcome)


def report(outcome: Outcome) -> int:
    """Print what happened to each job; 1 if any was refused, unknown or already finished (nothing
    was sent for those: a cancel the scheduler cannot apply would only be retried and dropped)."""
    if outcome.unchecked:
        print("roundhouse cancel: no scheduler is leading; the cancel is queued and checked when one leads",
              file=sys.stderr)  # fmt: skip
    for job_id in outcome.requested:
        print(f"{job_id} cancel requested")
    for job_id, status in outcome.finished.items():
        print(f"roundhouse cancel: {job_id} already {status}; nothing to cancel", file=sys.stderr)
    for message in outcome.errors:
        print(f"roundhouse cancel: {message}", file=sys.stderr)
    return 1 if outcome.errors or outcome.finished else 0
