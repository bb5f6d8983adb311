"""The book keeps a job's checkpoint iteration beside its path, and a run lost past its checkpoint
gives back the progress it made (``services/scheduler/book.py``).

The scenario throughout: job ``j`` ran under ``L1`` and was suspended with a checkpoint at
``CKPT``; it was granted again under ``L2``, whose reports (the ``job-metrics`` aggregate) took it
to ``PAST`` before ``L2`` was lost without a fact (its node went silent). A new run resumes from
``CKPT``, and ``PAST - CKPT`` iterations are to be done again.
"""

from __future__ import annotations

import pytest

from schemas.job import JobSpec
from schemas.leases import RevokeReason
from services.core.state import JobStatus
from services.metrics.aggregates import JobAggregate
from services.runtime.kv import KVEntry
from services.runtime.store import JobRecord, UpdateJob
from services.scheduler.book import Change, JobBook, JobEntry
from services.scheduler.leases import Lease
from services.scheduler.metrics import apply_metrics

CKPT = 500
PAST = 800
PATH = "/ckpt/j/checkpoint.pt"


def commit(change: Change | None) -> Change:
    assert change is not None
    change.commit()
    return change


def lease(lease_id: str, at: float) -> Lease:
    return Lease(lease_id, "j", (("n0", (0,)),), epoch=1, granted_at=at)


def report(book: JobBook, lease_id: str | None, iteration: int) -> None:
    aggregate = JobAggregate(job_id="j", iteration=iteration, samples=1, last_ts=0.0, lease_id=lease_id)
    apply_metrics(book, KVEntry("j", aggregate.model_dump_json().encode(), revision=1), 0.0)


def job_updates(change: Change) -> dict[str, object]:
    """Every job column ``change`` writes to the store (the last value of each)."""
    written: dict[str, object] = {}
    for op in change.ops:
        if isinstance(op, UpdateJob):
            written.update(op.changes)
    return written


def progressed_past_checkpoint(*, checkpoint: str | None = PATH) -> tuple[JobBook, JobEntry]:
    """``j`` suspended under L1 (with a checkpoint at CKPT, or none), running under L2 at PAST."""
    book = JobBook()
    commit(book.arrived("j", JobSpec(name="j", command=["x"]), submit_time=0.0))
    commit(book.accepted("j", 1.0))
    commit(book.grant("j", lease("L1", 10.0), 10.0))
    ckpt_iter = CKPT if checkpoint is not None else None
    commit(book.release("L1", 20.0, checkpoint=checkpoint, checkpoint_iteration=ckpt_iter, iterations=ckpt_iter))
    commit(book.grant("j", lease("L2", 30.0), 30.0))
    report(book, "L2", PAST)
    entry = book.jobs["j"]
    assert entry.state.iterations_done == PAST
    return book, entry


def test_a_new_run_resumes_from_the_checkpoint_not_from_the_reported_progress() -> None:
    book, entry = progressed_past_checkpoint()
    assert (entry.checkpoint_path, entry.checkpoint_iteration) == (PATH, CKPT)
    assert book.resume_iteration(entry) == CKPT
    assert book.leases["L2"].from_iteration == CKPT


def test_a_lost_run_gives_its_progress_past_the_checkpoint_back() -> None:
    book, entry = progressed_past_checkpoint()
    released = commit(book.release("L2", 40.0))  # its node went silent: no fact, no checkpoint
    state = entry.state
    assert (state.status, state.iterations_done, state.preemptions) == (JobStatus.QUEUED, CKPT, 2)
    assert job_updates(released)["iterations_done"] == CKPT  # and so does the store
    assert (entry.checkpoint_path, book.resume_iteration(entry)) == (PATH, CKPT)
    third = lease("L3", 50.0)
    commit(book.grant("j", third, 50.0))
    assert third.from_iteration == CKPT


def test_a_lost_run_without_any_checkpoint_starts_again_from_zero() -> None:
    book, entry = progressed_past_checkpoint(checkpoint=None)
    commit(book.release("L2", 40.0))
    assert entry.state.iterations_done == 0
    assert book.resume_iteration(entry) is None


def test_a_replayed_aggregate_of_the_lost_run_does_not_bring_its_progress_back() -> None:
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0))
    report(book, "L2", PAST)  # the KV watch replays the bucket after a failover
    assert entry.state.iterations_done == CKPT
    commit(book.grant("j", lease("L3", 50.0), 50.0))
    report(book, "L2", PAST + 5)  # a late flush of the lost run's samples
    assert entry.state.iterations_done == CKPT
    report(book, "L3", CKPT + 3)  # the new run's own progress counts
    assert entry.state.iterations_done == CKPT + 3


def test_a_suspension_after_the_grace_period_keeps_only_its_checkpoint() -> None:
    """``job.suspended`` with ``grace_expired``: the job reached PAST but its checkpoint is older."""
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0, checkpoint=PATH, checkpoint_iteration=CKPT + 100, iterations=CKPT + 100))
    assert (entry.state.iterations_done, entry.checkpoint_iteration) == (CKPT + 100, CKPT + 100)
    assert book.resume_iteration(entry) == CKPT + 100


@pytest.mark.parametrize(
    ("late", "resumes_from"),
    [(CKPT + 200, CKPT + 200), (CKPT - 100, CKPT)],
    ids=["newer-checkpoint-kept", "older-checkpoint-ignored"],
)
def test_a_late_suspension_of_a_lost_run_keeps_only_a_newer_checkpoint(late: int, resumes_from: int) -> None:
    """The worker suspended the job itself (lease expired) after the scheduler released the lease."""
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0))
    commit(book.late_checkpoint("j", PATH, late))
    assert book.resume_iteration(entry) == resumes_from
    assert entry.state.iterations_done == resumes_from


@pytest.mark.parametrize(
    ("then", "resumes_from"),
    [
        pytest.param(("suspended", CKPT + 50), CKPT + 200, id="re-run-stopped-behind-the-late-checkpoint"),
        pytest.param(("suspended", CKPT + 300), CKPT + 300, id="re-run-got-further"),
        pytest.param(("lost", None), CKPT + 200, id="re-run-lost"),
    ],
)
def test_a_late_checkpoint_that_lands_after_the_job_was_granted_again_is_kept(
    then: tuple[str, int | None], resumes_from: int
) -> None:
    """Issue 18's race, forced: a silent node's lease is released at the TTL, the node comes back and
    its heartbeat overtakes its queued ``job.suspended``, the job is granted again (resuming from
    CKPT), and only then does the suspension's newer checkpoint land. Before, it was ignored (a lease
    was set) and the job resumed from CKPT forever after."""
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0))  # lost with its node
    third = lease("L3", 50.0)
    commit(book.grant("j", third, 50.0))
    assert third.from_iteration == CKPT
    commit(book.late_checkpoint("j", "/ckpt/j/late.pt", CKPT + 200))
    assert (entry.checkpoint_path, book.resume_iteration(entry)) == ("/ckpt/j/late.pt", CKPT + 200)
    assert entry.lease is third  # the re-run runs on
    kind, iteration = then
    if kind == "suspended":
        commit(book.release("L3", 60.0, checkpoint="/ckpt/j/l3.pt", checkpoint_iteration=iteration,
                            iterations=iteration))  # fmt: skip
    else:
        commit(book.release("L3", 60.0))
    assert book.resume_iteration(entry) == resumes_from
    assert entry.state.iterations_done == resumes_from
    fourth = lease("L4", 70.0)
    commit(book.grant("j", fourth, 70.0))
    assert fourth.from_iteration == resumes_from


def test_a_late_checkpoint_no_newer_than_the_re_run_s_is_a_no_op() -> None:
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0))
    commit(book.grant("j", lease("L3", 50.0), 50.0))
    assert not commit(book.late_checkpoint("j", PATH, CKPT)).ops
    assert not commit(book.late_checkpoint("j", "/ckpt/old.pt", CKPT - 1)).ops
    assert (entry.checkpoint_path, entry.checkpoint_iteration) == (PATH, CKPT)


def test_a_periodic_checkpoint_of_the_released_run_that_lands_after_a_re_grant_is_kept() -> None:
    """A restarted agent reports its predecessor's newest checkpoint (job.checkpointed, the old
    lease), racing its own node.register: the release and a re-grant may come first."""
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0))
    commit(book.grant("j", lease("L3", 50.0), 50.0))
    commit(book.checkpointed("j", "L2", "/ckpt/j/l2.pt", CKPT + 250))
    assert (entry.checkpoint_path, book.resume_iteration(entry)) == ("/ckpt/j/l2.pt", CKPT + 250)
    commit(book.release("L3", 60.0))  # the re-run lost too: the next run resumes from the newest
    assert book.resume_iteration(entry) == CKPT + 250
    assert not commit(book.checkpointed("j", "L1", "/ckpt/j/l1.pt", CKPT + 900)).ops  # not the run released last


def test_a_completion_records_its_checkpoint_as_of_unknown_iteration() -> None:
    """``job.completed`` carries a path but no checkpoint iteration; the job keeps what it reached."""
    book, entry = progressed_past_checkpoint()
    done = commit(book.release("L2", 40.0, final=JobStatus.COMPLETED, checkpoint="/ckpt/j/final", iterations=900))
    assert job_updates(done)["checkpoint_iteration"] is None
    assert (entry.state.status, entry.state.iterations_done, entry.checkpoint_iteration) == (
        JobStatus.COMPLETED,
        900,
        None,
    )


def test_an_interrupted_run_found_at_load_is_requeued_at_its_checkpoint() -> None:
    record = JobRecord(
        job_id="j", spec=JobSpec(name="j", command=["x"]), submit_time=0.0, status=JobStatus.RUNNING, seq=1,
        iterations_done=PAST, checkpoint_path=PATH, checkpoint_iteration=CKPT,
    )  # fmt: skip
    book = JobBook()
    assert book.load([record], []) == ["j"]
    entry = book.jobs["j"]
    assert book.resume_iteration(entry) == CKPT
    commit(book.requeue("j", 100.0))
    assert (entry.state.status, entry.state.iterations_done) == (JobStatus.QUEUED, CKPT)


def test_a_checkpoint_of_unknown_iteration_falls_back_to_the_stored_progress() -> None:
    """A path without its iteration (a suspension from a worker older than checkpoint_iteration):
    the iterations_done that fact stored is the best guess, and a lost run leaves it as it is."""
    book = JobBook()
    record = JobRecord(
        job_id="j", spec=JobSpec(name="j", command=["x"]), submit_time=0.0, status=JobStatus.QUEUED, seq=1,
        iterations_done=CKPT, checkpoint_path=PATH,
    )  # fmt: skip
    book.load([record], [])
    entry = book.jobs["j"]
    assert book.resume_iteration(entry) == CKPT
    second = lease("L2", 30.0)
    commit(book.grant("j", second, 30.0))
    assert second.from_iteration == CKPT
    commit(book.release("L2", 40.0))
    assert entry.state.iterations_done == CKPT


# --- periodic checkpoints (job.checkpointed) -------------------------------------------------------
NEWER = CKPT + 200
"""A periodic checkpoint L2 wrote after it resumed from CKPT (and before PAST)."""


def test_a_periodic_checkpoint_of_the_running_run_is_what_a_later_loss_rewinds_to() -> None:
    book, entry = progressed_past_checkpoint()
    version = book.state_version
    change = commit(book.checkpointed("j", "L2", PATH, NEWER))
    assert job_updates(change) == {"checkpoint_path": PATH, "checkpoint_iteration": NEWER}  # persisted
    assert (entry.checkpoint_iteration, entry.state.iterations_done) == (NEWER, PAST)  # progress kept
    assert book.state_version == version  # a plan ranked on the running job stays valid
    assert book.leases["L2"].from_iteration == CKPT  # the run itself still started from CKPT
    released = commit(book.release("L2", 40.0))  # then its node goes silent
    assert job_updates(released)["iterations_done"] == NEWER  # only the work past NEWER is lost
    assert (entry.state.status, entry.state.iterations_done) == (JobStatus.QUEUED, NEWER)
    third = lease("L3", 50.0)
    commit(book.grant("j", third, 50.0))
    assert third.from_iteration == NEWER  # the grant's resume_iteration


def test_a_periodic_checkpoint_ahead_of_the_lagging_metrics_raises_the_progress() -> None:
    book, entry = progressed_past_checkpoint()
    change = commit(book.checkpointed("j", "L2", PATH, PAST + 10))
    assert job_updates(change)["iterations_done"] == PAST + 10
    assert entry.state.iterations_done == PAST + 10


def test_a_periodic_checkpoint_that_lands_after_its_lost_run_was_released_still_counts() -> None:
    book, entry = progressed_past_checkpoint()
    commit(book.release("L2", 40.0))
    assert entry.state.iterations_done == CKPT
    version = book.state_version
    change = commit(book.checkpointed("j", "L2", "/other/checkpoint.pt", NEWER))
    assert job_updates(change) == {
        "checkpoint_path": "/other/checkpoint.pt", "checkpoint_iteration": NEWER, "iterations_done": NEWER,
    }  # fmt: skip
    assert (entry.state.iterations_done, book.resume_iteration(entry)) == (NEWER, NEWER)
    assert book.state_version > version  # a waiting job's progress is what policies rank by
    assert entry.state.status is JobStatus.QUEUED


def test_a_redelivered_periodic_checkpoint_is_a_no_op() -> None:
    book, entry = progressed_past_checkpoint()
    commit(book.checkpointed("j", "L2", PATH, NEWER))
    version = entry.version
    again = commit(book.checkpointed("j", "L2", PATH, NEWER))
    assert again.is_empty
    assert entry.version == version


def _unchanged(book: JobBook, entry: JobEntry, change: Change) -> None:
    assert change.is_empty
    assert (entry.checkpoint_path, entry.checkpoint_iteration) == (PATH, CKPT)


@pytest.mark.parametrize("iteration", [CKPT, CKPT - 100], ids=["same-as-known", "older-than-known"])
def test_a_periodic_checkpoint_not_newer_than_the_known_one_is_ignored(iteration: int) -> None:
    book, entry = progressed_past_checkpoint()
    _unchanged(book, entry, commit(book.checkpointed("j", "L2", "/elsewhere", iteration)))
    assert entry.state.iterations_done == PAST


def test_a_periodic_checkpoint_of_an_earlier_run_is_ignored() -> None:
    """L1 (suspended, then replaced by L2) is a stale lease; L2, released last, is not."""
    book, entry = progressed_past_checkpoint()
    _unchanged(book, entry, commit(book.checkpointed("j", "L1", PATH, NEWER)))  # L2 runs
    commit(book.release("L2", 40.0))
    _unchanged(book, entry, commit(book.checkpointed("j", "L1", PATH, NEWER)))  # L2 was released last
    commit(book.grant("j", lease("L3", 50.0), 50.0))
    _unchanged(book, entry, commit(book.checkpointed("j", "L1", PATH, NEWER)))  # still not L1's
    # L2's, landing after the re-grant, is kept for the next run (L3 resumed from CKPT and runs on).
    commit(book.checkpointed("j", "L2", PATH, NEWER))
    assert book.leases["L3"].from_iteration == CKPT
    assert book.resume_iteration(entry) == NEWER


def test_a_periodic_checkpoint_of_a_finished_or_unknown_job_is_ignored() -> None:
    book, entry = progressed_past_checkpoint()
    # Cancelled while running: final already, its lease still being revoked.
    commit(book.end("j", JobStatus.CANCELLED, RevokeReason.CANCEL, now=35.0, grace_deadline=45.0))
    assert entry.lease is not None
    _unchanged(book, entry, commit(book.checkpointed("j", "L2", PATH, NEWER)))
    commit(book.release("L2", 40.0, final=JobStatus.FAILED, iterations=PAST))
    assert commit(book.checkpointed("j", "L2", PATH, NEWER)).is_empty
    assert commit(book.checkpointed("nobody", "L9", PATH, NEWER)).is_empty
