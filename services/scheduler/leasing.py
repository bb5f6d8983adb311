"""The book's lease transitions: a job's runs start, stop and end.

* ``grant`` gives a waiting job a lease (``lifecycle.launch``); ``grant_failed`` undoes a grant no
  worker took, as if it never happened.
* ``revoke`` marks a running job's lease REVOKING (a plan's suspension); ``end`` gives a job its
  final status now (cancel, terminate) and revokes its lease if it runs; ``requeue`` puts a job
  the store says is RUNNING without a lease back in the queue.
* ``release``: a run stopped. Its service is folded into the stored value
  (``lifecycle.progress``), and the job waits again (``lifecycle.suspend``, back at its newest
  checkpoint: ``checkpoints.rewind``) or ends (``lifecycle.finish``).
* ``finished_without_lease`` and ``completed_under_earlier_lease``: a completion or failure that
  lands when the run it reports is no longer the job's lease.

Attained service (Tiresias' GPU-seconds, what LAS ranks by): a running job's stored value is the
service it had when its lease started (``JobEntry.service0``); a release folds
``gpus x (at - last_start_time)`` into it. These functions are ``JobBook`` methods (``book.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.fields import MAX_REASON_CHARS
from schemas.leases import RevokeReason
from services.core import lifecycle
from services.core.lifecycle import Changes
from services.core.state import JobStatus
from services.runtime.store import JobChanges, LeaseState
from services.scheduler.change import Change
from services.scheduler.checkpoints import older, resume_iteration, rewind
from services.scheduler.entry import JobEntry
from services.scheduler.leases import Lease

if TYPE_CHECKING:
    from services.scheduler.book import JobBook


# --- user intent and policy decisions -------------------------------------------------------
def end(
    book: JobBook,
    job_id: str,
    status: JobStatus,
    reason: RevokeReason,
    *,
    now: float,
    grace_deadline: float,
    message: str | None = None,
    extra: JobChanges | None = None,
) -> Change:
    """Cancel (``CANCELLED``) or terminate (``COMPLETED``) a job: a waiting job ends now; a running
    one gets its final status now and its lease is revoked (``change.revokes``). ``extra`` columns
    are written with the status."""
    entry = book.jobs.get(job_id)
    change = Change()
    if entry is None or entry.state.status.is_final:
        return change
    if message:  # stored with the final status (``jobs.reason``), applied to the entry on commit
        extra = {**(extra or {}), "reason": message[:MAX_REASON_CHARS]}
    lease = entry.lease
    if lease is None:
        record = Changes()
        lifecycle.finish(entry.state, status, now, into=record)
        change.transition(entry, record, extra)
    else:
        # Its final status now, so that no round ranks it again; it finishes when its run stops
        # (``release`` keeps this status and records the finish time).
        change.update_job(entry, {"status": status, **(extra or {})})
        if lease.state is LeaseState.GRANTED:
            _revoking(change, lease, reason, grace_deadline)
    book._touch(change, entry)
    return change


def requeue(book: JobBook, job_id: str, now: float) -> Change | None:
    """A job the store says is RUNNING but that holds no lease (an interrupted grant): it waits again."""
    entry = book.jobs.get(job_id)
    if entry is None or entry.lease is not None or entry.state.status is not JobStatus.RUNNING:
        return None
    change = Change()
    # Its run is gone with whatever it did past the checkpoint: it resumes from there.
    record = Changes()
    lifecycle.suspend(entry.state, now, preempted=False, into=record)
    change.transition(entry, record, rewind(entry.checkpoint_path, entry.checkpoint_iteration))
    book._touch(change, entry)
    return change


def revoke(book: JobBook, job_id: str, reason: RevokeReason, deadline: float) -> Change | None:
    """Mark a running job's lease REVOKING (a plan's suspension); None if it is not granted."""
    entry = book.jobs.get(job_id)
    if entry is None or entry.lease is None or entry.lease.state is not LeaseState.GRANTED:
        return None
    change = Change()
    _revoking(change, entry.lease, reason, deadline)
    book._touch(change, entry)
    return change


def _revoking(change: Change, lease: Lease, reason: RevokeReason, deadline: float) -> None:
    change.put_lease(lease, LeaseState.REVOKING, deadline)

    def effect() -> None:
        lease.state = LeaseState.REVOKING
        lease.revoke_deadline = deadline
        lease.reason = reason

    change.then(effect)
    change.revokes.append((lease, reason))


def grant(book: JobBook, job_id: str, lease: Lease, now: float) -> Change | None:
    """A waiting job gets ``lease``; None if it is no longer waiting."""
    entry = book.jobs.get(job_id)
    if entry is None or entry.state.status is not JobStatus.QUEUED or entry.lease is not None:
        return None
    state = entry.state
    record = Changes()
    lifecycle.launch(state, now, into=record)  # its GPUs come with the next ``refresh``
    change = Change()
    change.put_lease(lease, LeaseState.GRANTED)
    previous_wait = state.queued_since

    def attach() -> None:
        book._index_lease(lease)
        entry.lease = lease
        lease.from_iteration = resume_iteration(entry) or 0
        entry.service0 = state.attained_service
        entry.executed0 = state.executed_time
        entry.requeued_since = previous_wait

    change.then(attach)
    change.transition(entry, record)
    book._touch(change, entry)
    return change


def grant_failed(book: JobBook, lease_id: str) -> Change | None:
    """Undo a grant no worker took: the job waits again as before (no preemption counted)."""
    lease = book.leases.get(lease_id)
    if lease is None:
        return None
    entry = book.jobs[lease.job_id]
    change = Change()
    change.put_lease(lease, LeaseState.RELEASED)
    status = entry.state.status if entry.state.status.is_final else JobStatus.QUEUED
    changes: JobChanges = {"status": status, "queued_since": entry.requeued_since}
    if status.is_final:
        changes["finish_time"] = entry.state.finish_time or lease.granted_at
    _detach(book, change, entry, lease)
    change.update_job(entry, changes)
    book._touch(change, entry)
    return change


# --- workers' facts -------------------------------------------------------------------------
def release(
    book: JobBook,
    lease_id: str,
    at: float,
    *,
    final: JobStatus | None = None,
    checkpoint: str | None = None,
    checkpoint_iteration: int | None = None,
    iterations: int | None = None,
    count_preemption: bool = True,
    extra: JobChanges | None = None,
) -> Change | None:
    """The lease's job stopped at ``at``: fold its service; requeue it, or end it with ``final``
    (or with the final status it already has: cancel/terminate). None if the lease is not active.

    ``checkpoint`` (with the iteration it holds) is the run's newest checkpoint, as its fact
    reported it; ``iterations`` the iteration the run reached. A requeued job's
    ``iterations_done`` goes back to its checkpoint's iteration (0 without one): a lost run
    (no fact: ``checkpoint`` None) keeps the newest checkpoint known, the one it resumed from
    or a later periodic one it reported (``checkpointed``), and a suspension's progress past
    its checkpoint is lost too. A job that ends keeps the iteration it reached: the fact's, or
    the furthest its run reported (``job-metrics``) when the fact says less or nothing. ``extra``
    columns (a failure's reason) are written with a final status."""
    lease = book.leases.get(lease_id)
    if lease is None:
        return None
    entry = book.jobs[lease.job_id]
    state = entry.state
    start = state.last_start_time if state.last_start_time is not None else lease.granted_at
    record = Changes()
    lifecycle.progress(
        state, at, since=start, service0=entry.service0, executed0=entry.executed0, gpus=lease.gpu_count,
        into=record,
    )
    changes: JobChanges = {}
    # A job already completed (its work done under an earlier lease) keeps that run's progress:
    # the checkpoint of a re-run stopped after it is older.
    behind = state.status is JobStatus.COMPLETED and iterations is not None and iterations < state.iterations_done
    if checkpoint is not None and older(checkpoint_iteration, entry):
        # A newer checkpoint of an earlier run landed while this run went (``late_checkpoint``):
        # the job resumes from that one, not from this run's older one.
        checkpoint, checkpoint_iteration = entry.checkpoint_path, entry.checkpoint_iteration
    if checkpoint is not None and not behind:
        # A path reported without its iteration (job.completed and job.failed carry none) is
        # recorded as of unknown iteration rather than paired with the previous checkpoint's.
        changes["checkpoint_path"] = checkpoint
        changes["checkpoint_iteration"] = checkpoint_iteration
    status = final if final is not None else state.status
    if status.is_final and not behind:
        # The run's own progress reports (applied to ``state`` in memory) count as much as the
        # fact: a failure often says no iteration, and a run's last report may follow the fact's.
        iterations = max(iterations or 0, state.iterations_done)
    if iterations is not None and not behind:
        changes["iterations_done"] = iterations
    if status.is_final:
        lifecycle.finish(state, status, at, into=record)
        if extra:
            changes.update(extra)
    else:
        lifecycle.suspend(state, at, preempted=count_preemption, into=record)
        if checkpoint is None:  # no fact (a lost run), or one without a checkpoint: the old one
            changes.update(rewind(entry.checkpoint_path, entry.checkpoint_iteration))
        else:
            changes.update(rewind(checkpoint, checkpoint_iteration))
    change = Change()
    change.put_lease(lease, LeaseState.RELEASED)
    _detach(book, change, entry, lease)
    lost = checkpoint is None

    def note_lost() -> None:
        entry.released_lost = lost

    change.then(note_lost)
    change.transition(entry, record, changes)

    def fold() -> None:
        entry.service0 = state.attained_service
        entry.executed0 = state.executed_time

    change.then(fold)
    book._touch(change, entry)
    change.released.append(lease_id)
    return change


def _detach(book: JobBook, change: Change, entry: JobEntry, lease: Lease) -> None:
    def effect() -> None:
        lease.state = LeaseState.RELEASED
        book._unindex_lease(lease)
        if entry.lease is lease:
            entry.lease = None
            entry.released_lease_id = lease.lease_id
            entry.state.resumed_at = None
            entry.state.run_start_service = None

    change.then(effect)


def finished_without_lease(  # noqa: PLR0917 (a JobBook method: ``book`` is its self)
    book: JobBook,
    job_id: str,
    status: JobStatus,
    at: float,
    checkpoint: str | None,
    iterations: int | None,
    extra: JobChanges | None = None,
) -> Change:
    """A completion or failure for a job that holds no lease now (e.g. its lease was released
    at the revoke deadline and the job ended during its grace period); ``extra`` columns (a
    failure's reason) are written with it."""
    entry = book.jobs.get(job_id)
    change = Change()
    if entry is None or entry.state.status.is_final or entry.lease is not None:
        return change
    record = Changes()
    lifecycle.finish(entry.state, status, at, into=record)
    changes: JobChanges = {}
    if checkpoint is not None:
        changes["checkpoint_path"] = checkpoint
        changes["checkpoint_iteration"] = None  # a completion or failure does not say
    if iterations is not None:
        changes["iterations_done"] = iterations
    if extra:
        changes.update(extra)
    change.transition(entry, record, changes)
    book._touch(change, entry)
    return change


def completed_under_earlier_lease(
    book: JobBook,
    job_id: str,
    at: float,
    checkpoint: str | None,
    iterations: int | None,
    *,
    grace_deadline: float,
) -> Change:
    """A ``job.completed`` for an earlier lease of a job that runs under a newer one.

    The earlier lease was released without this fact (omitted from its node's heartbeats past
    ``reconcile_grace_s``, or past its revoke deadline), the job was requeued and granted again,
    and then the durable fact landed: the job's work is done. It is completed (finished at
    ``at``, with that run's checkpoint and iterations) and its newer lease, if granted, is
    revoked with reason ``TERMINATE`` (``change.revokes``); the re-run's release keeps the
    final status.
    """
    entry = book.jobs.get(job_id)
    if entry is None or entry.lease is None:
        return Change()
    changes: JobChanges = {"finish_time": at, "queued_since": None}
    if checkpoint is not None:
        changes["checkpoint_path"] = checkpoint
        changes["checkpoint_iteration"] = None  # job.completed does not say
    if iterations is not None:
        changes["iterations_done"] = max(iterations, entry.state.iterations_done)
    return end(
        book, job_id, JobStatus.COMPLETED, RevokeReason.TERMINATE, now=at, grace_deadline=grace_deadline, extra=changes
    )
