"""The book's checkpoint rules and the transitions that only move a job's checkpoint.

An entry keeps its checkpoint's path *and* the iteration that checkpoint holds
(``checkpoint_iteration``, stored beside the path). A new run resumes from that iteration
(:func:`resume_iteration`), not from ``iterations_done``, which follows the job-metrics past the
checkpoint while a run progresses. A running job's periodic checkpoints (``job.checkpointed``,
:func:`checkpointed`) move it forward while the run goes on; a suspension reported after its lease
was released (:func:`late_checkpoint`) is kept if it is newer. A run that stops without a newer
checkpoint loses the progress past the newest checkpoint known: the job is requeued with
``iterations_done`` back at that checkpoint's iteration (:func:`rewind`; ``leasing.release``).

:func:`checkpointed` and :func:`late_checkpoint` are ``JobBook`` methods (``book.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.runtime.store import JobChanges
from services.scheduler.change import Change
from services.scheduler.entry import JobEntry

if TYPE_CHECKING:
    from services.scheduler.book import JobBook


def resume_iteration(entry: JobEntry) -> int | None:
    """The iteration a new run of ``entry``'s job resumes from: that of its checkpoint (the
    grant's ``resume_iteration``); None when it has none and starts afresh."""
    if not entry.checkpoint_path:
        return None
    if entry.checkpoint_iteration is not None:
        return entry.checkpoint_iteration
    # A checkpoint whose iteration nobody reported: a job.suspended from a worker that predates
    # checkpoint_iteration (schema 1 stores were filled from iterations_done when upgraded, see
    # services/runtime/store/migrations.py). Such a fact set iterations_done to the checkpoint's
    # iteration, and a run lost later leaves it there (``release``), so it is the best guess
    # left; the training client warns if the checkpoint holds another iteration.
    return entry.state.iterations_done


def rewind(checkpoint: str | None, checkpoint_iteration: int | None) -> JobChanges:
    """``iterations_done`` of a job that will resume from ``checkpoint``: the iteration it holds,
    0 without a checkpoint. Whatever the run did past it (in memory, from the job-metrics) is
    work to do again. (The simulator's runs always stop with a checkpoint and lose nothing; a
    live run can be lost.) A checkpoint of unknown iteration (see ``resume_iteration``) leaves
    ``iterations_done`` as it is."""
    if checkpoint is None:
        return {"iterations_done": 0}
    if checkpoint_iteration is None:
        return {}
    return {"iterations_done": checkpoint_iteration}


def older(checkpoint_iteration: int | None, entry: JobEntry) -> bool:
    """Whether a run's checkpoint at ``checkpoint_iteration`` is older than the one ``entry`` holds
    (both of known iteration)."""
    known = entry.checkpoint_iteration if entry.checkpoint_path else None
    return checkpoint_iteration is not None and known is not None and checkpoint_iteration < known


def late_checkpoint(book: JobBook, job_id: str, checkpoint: str | None, checkpoint_iteration: int | None) -> Change:
    """A suspension reported after the lease was already released (the run was lost, e.g. at
    its revoke deadline or with its node, and the worker's fact came later): keep its
    checkpoint if it is newer than the one the job would resume from, and resume from there.

    The job may have been granted again meanwhile (a returning node's heartbeat overtook its
    queued ``job.suspended``; issue 18): the newer checkpoint is kept all the same, so that the
    next run resumes from it unless the current run gets further (``release`` keeps the newer
    of the two). The current run, which resumed from the older one, runs on."""
    entry = book.jobs.get(job_id)
    change = Change()
    if entry is None or entry.state.status.is_final or checkpoint is None:
        return change
    current = resume_iteration(entry)
    if checkpoint_iteration is not None and current is not None and checkpoint_iteration < current:
        return change
    if entry.lease is not None and (checkpoint_iteration is None or checkpoint_iteration == current):
        return change  # nothing newer than what the running run resumed from
    changes: JobChanges = {"checkpoint_path": checkpoint, "checkpoint_iteration": checkpoint_iteration}
    if entry.lease is None:
        changes.update(rewind(checkpoint, checkpoint_iteration))
    change.update_job(entry, changes)
    if entry.lease is None:
        book._touch(change, entry)
    return change


def checkpointed(book: JobBook, job_id: str, lease_id: str, checkpoint: str, iteration: int) -> Change:
    """A periodic checkpoint of a run (``job.checkpointed``): the job now resumes from it.

    Kept only for the job's current run, or for the run released last while the job waits (the
    fact may land after a lost run's release: its consumer is not the one that saw the node go),
    and only if it is newer than the checkpoint the job would resume from; anything else (a
    finished job, an older lease, a redelivered or older checkpoint) is a no-op. A running job
    keeps its progress (``iterations_done`` only rises to the checkpoint's iteration, the
    metrics may lag) and a later loss of the run rewinds it to this checkpoint (``release``); a
    waiting job, rewound to an older checkpoint by that release, moves forward to this one.
    """
    entry = book.jobs.get(job_id)
    change = Change()
    if entry is None or entry.state.status.is_final:
        return change
    current = entry.lease is not None and entry.lease.lease_id == lease_id
    if not current:
        if entry.released_lease_id != lease_id:
            return change
        if entry.lease is not None:
            if not entry.released_lost:
                return change  # it stopped with its checkpoint reported: nothing newer can come
            # The run released last, lost, reported it after a re-run was granted (a restarted
            # agent reports its predecessor's newest checkpoint, racing its own registration):
            # kept as a late checkpoint, without rewinding the re-run.
            return late_checkpoint(book, job_id, checkpoint, iteration)
    known = resume_iteration(entry)
    if known is not None and iteration <= known:
        return change
    changes: JobChanges = {"checkpoint_path": checkpoint, "checkpoint_iteration": iteration}
    if entry.state.iterations_done < iteration:
        changes["iterations_done"] = iteration
    change.update_job(entry, changes)
    if not current:
        # A waiting job's progress is what policies rank by; a running one's moves with the
        # metrics without a new state version (a plan in flight stays valid).
        book._touch(change, entry)
    return change
