"""A job's way into the book: ``job.arrived`` and admission's verdicts (accepted, held, rejected).

A job arrives HELD, with the next sequence number (its place among jobs of equal rank), and waits
for admission: accepted, it is QUEUED (``lifecycle.admit``); rejected, it ends REJECTED with the
reason (stored); held, it stays HELD with the reason (memory only). These functions are ``JobBook``
methods (``book.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.job import JobSpec
from services.core import lifecycle
from services.core.lifecycle import Changes
from services.core.state import JobStatus
from services.runtime.consumer import RetryLater
from services.runtime.store import InsertJobs, JobRecord
from services.scheduler.change import Change
from services.scheduler.entry import JobEntry

if TYPE_CHECKING:
    from services.scheduler.book import JobBook


class JobNotArrivedError(RetryLater, LookupError):
    """An event names a job whose ``job.arrived`` the scheduler has not applied yet (retried)."""


def arrived(book: JobBook, job_id: str, spec: JobSpec, submit_time: float) -> Change | None:
    """A new job (HELD until admission accepts it); None if the book already has it."""
    if job_id in book.jobs:
        return None
    seq = book._next_seq
    book._next_seq += 1
    record = JobRecord(job_id=job_id, spec=spec, submit_time=submit_time, status=JobStatus.HELD, seq=seq)
    change = Change([InsertJobs((record,))])

    def effect() -> None:
        state = record.to_state()
        state.seq = seq
        book.jobs[job_id] = JobEntry(state, record.version)
        book.state_version += 1

    change.then(effect)
    return change


def accepted(book: JobBook, job_id: str, now: float) -> Change:
    entry = book.jobs.get(job_id)
    if entry is None:
        raise JobNotArrivedError(f"job {job_id!r} was accepted before its job.arrived was applied")
    change = Change()
    if entry.state.status is JobStatus.HELD:
        record = Changes()
        lifecycle.admit(entry.state, now, into=record)
        change.transition(entry, record)
        book._touch(change, entry)
    return change


def held(book: JobBook, job_id: str, reason: str) -> Change:
    entry = book.jobs.get(job_id)
    change = Change()
    if entry is not None:
        change.then(lambda: setattr(entry, "reason", reason))
    return change


def rejected(book: JobBook, job_id: str, reason: str, now: float) -> Change:
    entry = book.jobs.get(job_id)
    change = Change()
    if entry is not None and entry.state.status is JobStatus.HELD:
        record = Changes()
        lifecycle.finish(entry.state, JobStatus.REJECTED, now, into=record)
        change.transition(entry, record, {"reason": reason})
        book._touch(change, entry)
    return change
