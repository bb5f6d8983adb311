"""Issue 14: a failed job says why, and a finished job shows the iteration it reached.

``services/scheduler/failures.py`` turns the worker's ``job.failed`` into the stored reason; the book
writes it (and a rejection's or a cancel's reason) with the final status, and a job that ends keeps
the furthest iteration its run reported, not its last suspension's.
"""

from __future__ import annotations

import pytest

from schemas.fields import MAX_REASON_CHARS
from schemas.job import JobSpec
from schemas.jobs import FailureReason, JobFailed
from schemas.leases import RevokeReason
from services.core.state import JobStatus
from services.scheduler.book import JobBook
from services.scheduler.failures import failure_changes, failure_reason
from tests.unit.test_scheduler_checkpoints import CKPT, PAST, commit, job_updates, progressed_past_checkpoint


def failed(**fields: object) -> JobFailed:
    return JobFailed.model_validate({"job_id": "j", "node_id": "gpu-1", **fields})


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (failed(reason=FailureReason.EXIT_CODE, exit_code=3, message="rank 0 exited with 3: ValueError: lr"),
         "exit code 3 on gpu-1: rank 0 exited with 3: ValueError: lr"),
        (failed(reason=FailureReason.SIGNAL, signal=9, message=""), "killed by signal 9 (SIGKILL) on gpu-1"),
        (failed(reason=FailureReason.SIGNAL, signal=100, message="x"), "killed by signal 100 on gpu-1: x"),
        (failed(reason=FailureReason.LAUNCH_ERROR, message="cannot run 'trian.py': No such file"),
         "launch error on gpu-1: cannot run 'trian.py': No such file"),
        (failed(reason=FailureReason.NODE_LOST), "node lost on gpu-1"),
    ],
    ids=["exit-code", "signal", "unnamed-signal", "launch-error", "node-lost"],
)  # fmt: skip
def test_a_failure_says_what_ended_it_where(event: JobFailed, expected: str) -> None:
    assert failure_reason(event) == expected


def test_a_long_output_keeps_the_headline_and_its_last_lines() -> None:
    output = "\n".join(f"line {i}" for i in range(300)) + "\nRuntimeError: CUDA out of memory"
    reason = failure_reason(failed(reason=FailureReason.EXIT_CODE, exit_code=1, message=output))
    assert len(reason) == MAX_REASON_CHARS
    assert reason.startswith("exit code 1 on gpu-1: …")
    assert reason.endswith("line 299\nRuntimeError: CUDA out of memory")


def test_a_failure_writes_its_reason_exit_code_and_signal() -> None:
    event = failed(reason=FailureReason.SIGNAL, signal=9, message="Killed")
    assert failure_changes(event) == {"reason": "killed by signal 9 (SIGKILL) on gpu-1: Killed", "exit_code": None,
                                      "signal": 9}  # fmt: skip


@pytest.mark.parametrize(
    ("reported", "final"),
    [(None, PAST), (0, PAST), (CKPT, PAST), (PAST + 50, PAST + 50)],
    ids=["fact-says-none", "fact-says-zero", "fact-says-the-checkpoint", "fact-says-more"],
)
@pytest.mark.parametrize("status", [JobStatus.COMPLETED, JobStatus.FAILED])
def test_a_job_that_ends_keeps_the_furthest_iteration_its_run_reached(
    reported: int | None, final: int, status: JobStatus
) -> None:
    book, entry = progressed_past_checkpoint()  # suspended at CKPT, its second run reported PAST
    released = commit(book.release("L2", 40.0, final=status, iterations=reported))
    assert entry.state.iterations_done == final
    assert job_updates(released)["iterations_done"] == final


def test_a_failure_is_stored_with_the_final_status_and_read_back_from_the_entry() -> None:
    book, entry = progressed_past_checkpoint()
    details = failure_changes(failed(reason=FailureReason.EXIT_CODE, exit_code=2, message="boom"))
    change = book.release("L2", 40.0, final=JobStatus.FAILED, extra=details)
    assert change is not None
    written = job_updates(change)
    assert (written["status"], written["reason"], written["exit_code"]) == (JobStatus.FAILED, details["reason"], 2)
    assert entry.reason is None  # nothing in memory moves before the commit
    change.commit()
    assert (entry.reason, entry.exit_code, entry.signal) == (details["reason"], 2, None)


def test_a_rejection_and_a_cancel_store_their_reasons() -> None:
    book = JobBook()
    for job_id in ("r", "c"):
        commit(book.arrived(job_id, JobSpec(name=job_id, command=["x"]), submit_time=0.0))
    rejected = commit(book.rejected("r", "needs 64 GPUs; the cluster has 8", 1.0))
    assert job_updates(rejected)["reason"] == "needs 64 GPUs; the cluster has 8"
    commit(book.accepted("c", 1.0))
    cancelled = commit(book.end("c", JobStatus.CANCELLED, RevokeReason.CANCEL, now=2.0, grace_deadline=3.0,
                                message="wrong learning rate"))  # fmt: skip
    assert job_updates(cancelled)["reason"] == "wrong learning rate"
