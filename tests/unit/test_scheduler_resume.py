"""The live scheduler's ``JobState.resumed_at``: a run restores until it reports an iteration of its
own, for at most the restore allowance (``services/scheduler/resume.py``).

Each case goes through the book as the leader does: a grant, the ``job-metrics`` aggregates the
KV watch delivers (``apply_metrics``), then the snapshot (``JobBook.refresh``); the protection is
read by the time-slicing policies' own ``protected``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from schemas.job import JobSpec
from schemas.nodes import GpuInventory, NodeRegister
from services.core.state import JobStatus
from services.metrics.aggregates import JobAggregate
from services.runtime.kv import KVEntry
from services.runtime.store import JobRecord
from services.scheduler.book import Change, JobBook
from services.scheduler.inventory import Inventory
from services.scheduler.leases import Lease
from services.scheduler.metrics import apply_metrics
from services.scheduler.policies.time_slicing import protected
from services.scheduler.resume import progress_at, resumed_at
from services.scheduler.topology import Topology

LAUNCH = 1000.0
ALLOWANCE = 60.0
QUANTUM = 10.0
CHECKPOINT_ITERATION = 500


def commit(change: Change | None) -> None:
    assert change is not None
    change.commit()


def topology() -> Topology:
    inventory = Inventory(lease_ttl_s=30)
    inventory.register(
        NodeRegister(
            node_id="n0", incarnation=uuid.uuid4(), hostname="h", cpus=8, memory_gb=64,
            gpus=[GpuInventory(index=0, uuid="G-n0-0", name="G", memory_mib=1024)],
        ),
        now=0.0,
    )  # fmt: skip
    return Topology(inventory.live())


def book_with_resumed_job() -> tuple[JobBook, Lease, Lease]:
    """A job that ran under ``L1`` (stopped with a checkpoint at ``CHECKPOINT_ITERATION``) and was
    granted again under ``L2`` at ``LAUNCH``; returns the book and both leases."""
    book = JobBook()
    commit(book.arrived("j", JobSpec(name="j", command=["x"]), submit_time=0.0))
    commit(book.accepted("j", 1.0))
    first = Lease("L1", "j", (("n0", (0,)),), epoch=1, granted_at=10.0)
    commit(book.grant("j", first, 10.0))
    commit(book.release("L1", 500.0, checkpoint="/c/j", iterations=CHECKPOINT_ITERATION))
    second = Lease("L2", "j", (("n0", (0,)),), epoch=1, granted_at=LAUNCH)
    commit(book.grant("j", second, LAUNCH))
    return book, first, second


def report(book: JobBook, *, lease_id: str, iteration: int, ts: float, seen: float) -> None:
    """The aggregate the metrics service would write after a sample ``(lease_id, iteration, ts)``,
    delivered to the leader at ``seen``."""
    aggregate = JobAggregate(job_id="j", iteration=iteration, samples=1, last_ts=ts, lease_id=lease_id)
    assert apply_metrics(book, KVEntry("j", aggregate.model_dump_json().encode(), revision=1), seen)


@dataclass(frozen=True)
class Report:
    lease_id: str
    iteration: int
    ts: float
    seen: float


@pytest.mark.parametrize(
    ("reports", "now", "expected_resumed_at", "expected_protected"),
    [
        pytest.param([], LAUNCH + 30.0, LAUNCH + ALLOWANCE, True,
                     id="never reported, past the quantum: still restoring"),
        pytest.param([], LAUNCH + ALLOWANCE + 1.0, LAUNCH + ALLOWANCE, False,
                     id="never reported, past the allowance: competes"),
        pytest.param([Report("L1", CHECKPOINT_ITERATION + 7, 990.0, LAUNCH + 1.0)], LAUNCH + 30.0,
                     LAUNCH + ALLOWANCE, True, id="reported before this run (its lease): still restoring"),
        pytest.param([Report("L2", 0, LAUNCH + 1.0, LAUNCH + 2.0)], LAUNCH + 30.0, LAUNCH + ALLOWANCE, True,
                     id="this run before its restore (iteration 0): still restoring"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION, LAUNCH + 20.0, LAUNCH + 21.0)], LAUNCH + 30.0,
                     LAUNCH + ALLOWANCE, True, id="this run restored, no new iteration yet: still restoring"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION + 1, LAUNCH + 25.0, LAUNCH + 26.0)], LAUNCH + 30.0,
                     LAUNCH + 25.0, False, id="reported during this run: resumed then, competes"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION + 1, LAUNCH + 3.0, LAUNCH + 4.0)], LAUNCH + 5.0,
                     LAUNCH + 3.0, True, id="resumed within the quantum: the quantum still protects it"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION + 1, LAUNCH + 25.0, LAUNCH + 26.0),
                      Report("L2", CHECKPOINT_ITERATION + 90, LAUNCH + 40.0, LAUNCH + 41.0)], LAUNCH + 50.0,
                     LAUNCH + 25.0, False, id="later reports keep the first progress"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION + 1, LAUNCH + 90.0, LAUNCH + 91.0)], LAUNCH + 95.0,
                     LAUNCH + ALLOWANCE, False, id="first progress past the allowance: the allowance ended it"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION + 1, LAUNCH + 80.0, LAUNCH + 25.0)], LAUNCH + 30.0,
                     LAUNCH + 25.0, False, id="worker clock ahead: resumed when seen, not in our future"),
        pytest.param([Report("L2", CHECKPOINT_ITERATION + 1, LAUNCH - 5.0, LAUNCH + 25.0)], LAUNCH + 30.0,
                     LAUNCH, False, id="worker clock behind: not before the launch"),
    ],
)  # fmt: skip
def test_snapshot_rule(reports: list[Report], now: float, expected_resumed_at: float, expected_protected: bool) -> None:
    book, _, _ = book_with_resumed_job()
    for r in reports:
        report(book, lease_id=r.lease_id, iteration=r.iteration, ts=r.ts, seen=r.seen)
    book.refresh(now, topology(), restore_allowance_s=ALLOWANCE)
    state = book.jobs["j"].state
    assert state.resumed_at == pytest.approx(expected_resumed_at)
    assert protected(state, now, QUANTUM) is expected_protected


def test_a_fresh_start_resumes_at_its_first_iteration() -> None:
    book = JobBook()
    commit(book.arrived("j", JobSpec(name="j", command=["x"]), submit_time=0.0))
    commit(book.accepted("j", 1.0))
    lease = Lease("L1", "j", (("n0", (0,)),), epoch=1, granted_at=LAUNCH)
    commit(book.grant("j", lease, LAUNCH))
    assert lease.from_iteration == 0
    report(book, lease_id="L1", iteration=0, ts=LAUNCH + 1.0, seen=LAUNCH + 1.5)
    assert lease.progress_at is None
    report(book, lease_id="L1", iteration=1, ts=LAUNCH + 12.0, seen=LAUNCH + 12.5)
    book.refresh(LAUNCH + 20.0, topology(), restore_allowance_s=ALLOWANCE)
    assert book.jobs["j"].state.resumed_at == LAUNCH + 12.0


def test_a_new_run_restores_again_and_a_stopped_job_has_no_resume_time() -> None:
    book, _, second = book_with_resumed_job()
    report(book, lease_id="L2", iteration=CHECKPOINT_ITERATION + 1, ts=LAUNCH + 5.0, seen=LAUNCH + 6.0)
    commit(book.release("L2", LAUNCH + 100.0, checkpoint="/c/j2", iterations=CHECKPOINT_ITERATION + 300))
    state = book.jobs["j"].state
    assert state.status is JobStatus.QUEUED
    assert state.resumed_at is None
    relaunch = LAUNCH + 200.0
    third = Lease("L3", "j", (("n0", (0,)),), epoch=1, granted_at=relaunch)
    commit(book.grant("j", third, relaunch))
    assert (third.from_iteration, third.progress_at) == (CHECKPOINT_ITERATION + 300, None)
    # The previous run's numbers, still the newest in the bucket, do not count for this one.
    report(book, lease_id="L2", iteration=CHECKPOINT_ITERATION + 300, ts=LAUNCH + 99.0, seen=relaunch + 1.0)
    book.refresh(relaunch + 30.0, topology(), restore_allowance_s=ALLOWANCE)
    assert book.jobs["j"].state.resumed_at == relaunch + ALLOWANCE
    assert second.progress_at == LAUNCH + 5.0


def test_a_zero_allowance_turns_the_restore_protection_off() -> None:
    book, _, _ = book_with_resumed_job()
    book.refresh(LAUNCH + QUANTUM, topology(), restore_allowance_s=0.0)
    state = book.jobs["j"].state
    assert state.resumed_at == LAUNCH
    assert not protected(state, LAUNCH + QUANTUM, QUANTUM)


def test_a_new_leader_reads_the_run_it_finds_running() -> None:
    """After a failover the book is loaded from the store: the lease's ``from_iteration`` is the
    job's checkpoint iteration, and the bucket's current value (the watch replays it) tells whether
    the run had resumed already."""
    record = JobRecord(
        job_id="j", spec=JobSpec(name="j", command=["x"]), submit_time=0.0, status=JobStatus.RUNNING, seq=1,
        iterations_done=CHECKPOINT_ITERATION, checkpoint_path="/c/j", last_start_time=LAUNCH,
    )  # fmt: skip
    loaded = Lease("L2", "j", (("n0", (0,)),), epoch=1, granted_at=LAUNCH)
    book = JobBook()
    assert book.load([record], [loaded]) == []
    assert loaded.from_iteration == CHECKPOINT_ITERATION
    report(book, lease_id="L2", iteration=CHECKPOINT_ITERATION + 40, ts=LAUNCH + 8.0, seen=LAUNCH + 50.0)
    book.refresh(LAUNCH + 50.0, topology(), restore_allowance_s=ALLOWANCE)
    assert book.jobs["j"].state.resumed_at == LAUNCH + 8.0


@pytest.mark.parametrize(
    ("lease_id", "iteration", "ts", "expected"),
    [
        ("L1", 501, 1005.0, None),  # another run's numbers
        ("L2", 500, 1005.0, None),  # the checkpoint's iteration: restored, not yet progressed
        ("L2", 501, 1005.0, 1005.0),
        ("L2", 501, 2000.0, 1100.0),  # clamped to now
        ("L2", 501, 900.0, 1000.0),  # clamped to the launch
    ],
)
def test_progress_at(lease_id: str, iteration: int, ts: float, expected: float | None) -> None:
    lease = Lease("L2", "j", (("n0", (0,)),), epoch=1, granted_at=LAUNCH, from_iteration=500)
    aggregate = JobAggregate(job_id="j", iteration=iteration, last_ts=ts, lease_id=lease_id)
    assert progress_at(aggregate, lease, LAUNCH, 1100.0) == expected


@pytest.mark.parametrize(
    ("progress", "expected"), [(None, LAUNCH + ALLOWANCE), (LAUNCH + 7.0, LAUNCH + 7.0), (LAUNCH + 61.0, LAUNCH + 60.0)]
)
def test_resumed_at_is_the_first_progress_bounded_by_the_allowance(progress: float | None, expected: float) -> None:
    assert resumed_at(LAUNCH, progress, ALLOWANCE) == expected


def test_the_snapshot_carries_the_service_the_run_began_with() -> None:
    """``run_start_service``: the first run (L1, 10..500 s on one GPU) left 490 GPU-s; L2 began with
    them, whatever it has earned since; a released run has none."""
    book, _, _ = book_with_resumed_job()
    book.refresh(LAUNCH + 100.0, topology())
    state = book.jobs["j"].state
    assert (state.run_start_service, state.attained_service) == (490.0, 590.0)
    commit(book.release("L2", LAUNCH + 200.0, checkpoint="/c/j2", iterations=CHECKPOINT_ITERATION + 10))
    assert state.run_start_service is None
