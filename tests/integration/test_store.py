"""The store on both backends: every test runs on a real SQLite file and on a real PostgreSQL
(skipped, with the reason, when none is reachable)."""

from __future__ import annotations

import asyncio

import pytest

from services.core.decisions import Plan
from services.core.state import JobStatus
from services.runtime.store import (
    SCHEMA_VERSION,
    ConstraintViolationError,
    DeleteLeases,
    InsertJobs,
    JobNotFoundError,
    JobRecord,
    LeaseState,
    RoundRecord,
    StaleWriteError,
    Store,
    StoreClosedError,
    StoreConfig,
    UpdateJob,
    UpsertLeases,
)
from tests.integration.conftest_store import StoreFactory, job, lease, store, store_factory

__all__ = ["store", "store_factory"]  # fixtures, imported for pytest


# --- CRUD round trips ------------------------------------------------------------------------------


async def test_job_round_trips_every_field(store: Store) -> None:
    full = job(
        "j-full",
        gpus=4,
        user="bob",
        status=JobStatus.RUNNING,
        submit_time=1.5,
        admit_time=2.0,
        first_start_time=3.0,
        last_start_time=4.0,
        last_preempt_time=3.5,
        attained_service=120.25,
        executed_time=30.0625,
        iterations_done=12_345_678_901,
        preemptions=2,
        checkpoint_path="/ckpt/j-full/7",
        checkpoint_iteration=12_345_678_000,
        seq=42,
        queued_since=None,
        longest_wait_s=9.5,
    )
    await store.add_jobs([full, job("j-min")])

    assert await store.get_job("j-full") == full
    assert await store.get_job("j-min") == job("j-min")
    assert await store.get_job("absent") is None
    loaded = await store.get_job("j-full")
    assert loaded is not None
    assert (loaded.user, loaded.gpus, loaded.version) == ("bob", 4, 1)


async def test_jobs_by_status_and_active_jobs(store: Store) -> None:
    statuses = [
        JobStatus.HELD,
        JobStatus.QUEUED,
        JobStatus.RUNNING,
        JobStatus.COMPLETED,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.REJECTED,
    ]
    await store.add_jobs(job(f"j{i}", status=s, submit_time=float(10 - i)) for i, s in enumerate(statuses))

    running = await store.jobs_by_status(JobStatus.RUNNING)
    assert [j.job_id for j in running] == ["j2"]
    waiting = await store.jobs_by_status(JobStatus.QUEUED, JobStatus.HELD)
    assert [j.job_id for j in waiting] == ["j1", "j0"]  # oldest submission first
    active = await store.active_jobs()
    assert sorted(j.job_id for j in active) == ["j0", "j1", "j2"]
    assert all(not j.status.is_final for j in active)
    assert await store.jobs_by_status() == []


async def test_update_sets_fields_and_bumps_version(store: Store) -> None:
    await store.add_jobs([job("j1")])
    await store.update_job("j1", {"status": JobStatus.RUNNING, "last_start_time": 5.0, "admit_time": 1.0})
    await store.update_job("j1", {"iterations_done": 100, "checkpoint_path": "/c/1"}, expected_version=2)

    got = await store.get_job("j1")
    assert got is not None
    assert got.status is JobStatus.RUNNING
    assert (got.admit_time, got.last_start_time, got.iterations_done) == (1.0, 5.0, 100)
    assert got.checkpoint_path == "/c/1"
    assert got.version == 3
    assert got.spec == job("j1").spec  # untouched


async def test_update_of_unknown_job_raises_job_not_found(store: Store) -> None:
    with pytest.raises(JobNotFoundError, match="ghost"):
        await store.update_job("ghost", {"preemptions": 1})


async def test_a_checkpoint_and_its_iteration_are_updated_together(store: Store) -> None:
    await store.add_jobs([job("j1", iterations_done=30)])
    await store.update_job("j1", {"checkpoint_path": "/ckpt/j1", "checkpoint_iteration": 20, "iterations_done": 20})
    record = await store.get_job("j1")
    assert record is not None
    assert (record.checkpoint_path, record.checkpoint_iteration, record.iterations_done) == ("/ckpt/j1", 20, 20)


async def test_update_with_unknown_field_fails_in_the_caller(store: Store) -> None:
    await store.add_jobs([job("j1")])
    before = store.stats.requests
    with pytest.raises(ValueError, match="spec"):
        await store.update_job("j1", {"spec": "x"})  # type: ignore[typeddict-unknown-key]
    assert store.stats.requests == before  # never queued


async def test_leases_by_node_and_job(store: Store) -> None:
    await store.add_jobs([job("a"), job("b")])
    await store.upsert_leases(
        [
            lease("l1", "a", "node-0", gpu_indices=(0, 1), epoch=3, granted_at=1.0),
            lease("l2", "b", "node-0", gpu_indices=(2,), granted_at=2.0),
            lease("l3", "a", "node-1", gpu_indices=(0,), granted_at=3.0),
        ]
    )
    assert [x.lease_id for x in await store.leases_for_node("node-0")] == ["l1", "l2"]
    assert [x.lease_id for x in await store.leases_for_job("a")] == ["l1", "l3"]
    first = (await store.leases_for_node("node-0"))[0]
    assert first == lease("l1", "a", "node-0", gpu_indices=(0, 1), epoch=3, granted_at=1.0)

    # Upsert replaces by id: revoke l1, release l2.
    await store.upsert_leases(
        [
            lease("l1", "a", "node-0", gpu_indices=(0, 1), epoch=3, granted_at=1.0,
                  state=LeaseState.REVOKING, revoke_deadline=31.0),
            lease("l2", "b", "node-0", gpu_indices=(2,), granted_at=2.0, state=LeaseState.RELEASED),
        ]
    )  # fmt: skip
    live = await store.leases_for_node("node-0")
    assert [(x.lease_id, x.state, x.revoke_deadline) for x in live] == [("l1", LeaseState.REVOKING, 31.0)]
    everything = await store.leases_for_node("node-0", include_released=True)
    assert [x.lease_id for x in everything] == ["l1", "l2"]

    await store.delete_leases(["l1", "l3", "never-existed"])
    assert await store.leases_for_job("a", include_released=True) == []


async def test_lease_for_unknown_job_is_a_constraint_violation(store: Store) -> None:
    with pytest.raises(ConstraintViolationError, match="nothing from this request was written"):
        await store.upsert_leases([lease("l1", "no-such-job")])
    assert await store.leases_for_node("node-0", include_released=True) == []


async def test_rounds_last_round_and_duplicate_number(store: Store) -> None:
    assert await store.last_round() is None
    plan = Plan(launch={"j1": (0, 1), "j2": (3,)}, suspend=("j0",), terminate={"j9": "converged"})
    await store.record_round(RoundRecord(1, epoch=1, state_version=10, decided_at=100.0, plan=Plan()))
    await store.record_round(RoundRecord(2, epoch=1, state_version=11, decided_at=101.0, plan=plan))
    assert await store.last_round() == RoundRecord(2, epoch=1, state_version=11, decided_at=101.0, plan=plan)
    # A stale leader recording a round number again is refused.
    with pytest.raises(ConstraintViolationError):
        await store.record_round(RoundRecord(2, epoch=0, state_version=9, decided_at=102.0, plan=Plan()))


async def test_meta_holds_schema_version_and_user_keys(store: Store) -> None:
    assert await store.get_meta("schema_version") == str(SCHEMA_VERSION)
    await store.set_meta("leader", "a")
    await store.set_meta("leader", "b")
    assert await store.get_meta("leader") == "b"
    assert await store.get_meta("absent") is None


# --- idempotent event application ------------------------------------------------------------------


async def test_apply_event_twice_is_a_noop_the_second_time(store: Store) -> None:
    await store.add_jobs([job("j1")])
    first = await store.apply_event("evt-1", "scheduler", [UpdateJob("j1", {"preemptions": 1})])
    second = await store.apply_event("evt-1", "scheduler", [UpdateJob("j1", {"preemptions": 99})])

    assert (first, second) == (True, False)
    got = await store.get_job("j1")
    assert got is not None
    assert (got.preemptions, got.version) == (1, 2)
    assert await store.is_applied("evt-1", "scheduler")
    # Another consumer applies the same event independently.
    assert not await store.is_applied("evt-1", "metrics")
    assert await store.apply_event("evt-1", "metrics", []) is True


async def test_concurrent_redeliveries_apply_exactly_once(store: Store) -> None:
    await store.add_jobs([job("j1")])
    results = await asyncio.gather(
        *(store.apply_event("evt-x", "scheduler", [UpdateJob("j1", {"iterations_done": i})]) for i in range(10))
    )
    assert results.count(True) == 1
    got = await store.get_job("j1")
    assert got is not None
    assert got.version == 2


async def test_a_redelivery_in_a_batch_costs_one_retry_not_a_replay(store: Store) -> None:
    await store.apply_event("old", "c", [])
    before = store.stats
    futures = [store.apply_event_nowait(f"new{i}", "c", []) for i in range(10)]
    futures.insert(5, store.apply_event_nowait("old", "c", []))
    results = await asyncio.gather(*futures)

    assert results == [True] * 5 + [False] + [True] * 5
    after = store.stats
    assert (after.batches - before.batches, after.claim_retries - before.claim_retries) == (1, 1)
    assert after.isolated_retries == before.isolated_retries
    assert all([await store.is_applied(f"new{i}", "c") for i in range(10)])


async def test_replay_after_a_failed_batch_keeps_events_idempotent(store: Store) -> None:
    await store.add_jobs([job("j1")])
    await store.apply_event("seen", "c", [UpdateJob("j1", {"preemptions": 1})])
    before = store.stats
    # One batch: a redelivery, a request that fails, and a new event. The failure sends the batch to
    # the per-request replay, which must still recognise the redelivery.
    redelivered = store.apply_event_nowait("seen", "c", [UpdateJob("j1", {"preemptions": 50})])
    failing = store.submit_nowait([UpdateJob("ghost", {"preemptions": 1})])
    fresh = store.apply_event_nowait("new", "c", [UpdateJob("j1", {"iterations_done": 7})])
    results = await asyncio.gather(redelivered, failing, fresh, return_exceptions=True)

    assert results[0] is False
    assert isinstance(results[1], JobNotFoundError)
    assert results[2] is True
    assert store.stats.isolated_retries - before.isolated_retries == 1
    got = await store.get_job("j1")
    assert got is not None
    assert (got.preemptions, got.iterations_done, got.version) == (1, 7, 3)


async def test_failed_apply_is_not_marked_and_can_be_retried(store: Store) -> None:
    with pytest.raises(JobNotFoundError):
        await store.apply_event("evt-2", "scheduler", [UpdateJob("late", {"preemptions": 1})])
    assert not await store.is_applied("evt-2", "scheduler")

    await store.add_jobs([job("late")])
    assert await store.apply_event("evt-2", "scheduler", [UpdateJob("late", {"preemptions": 1})]) is True
    assert await store.is_applied("evt-2", "scheduler")


async def test_prune_applied_events(store: Store) -> None:
    await store.apply_event("old", "c1", [], applied_at=10.0)
    await store.apply_event("old", "c2", [], applied_at=10.0)
    await store.apply_event("new", "c1", [], applied_at=50.0)
    await store.prune_applied_events(older_than=20.0, consumer="c1")
    assert [await store.is_applied(e, c) for e, c in [("old", "c1"), ("old", "c2"), ("new", "c1")]] == [
        False,
        True,
        True,
    ]
    await store.prune_applied_events(older_than=20.0)
    assert not await store.is_applied("old", "c2")


# --- the batched writer --------------------------------------------------------------------------------


async def test_concurrent_writes_share_transactions(store: Store) -> None:
    before = store.stats
    await asyncio.gather(*(store.add_jobs([job(f"j{i}")]) for i in range(500)))
    after = store.stats

    assert after.requests - before.requests == 500
    assert after.rows - before.rows == 500
    assert after.transactions - before.transactions <= 5  # one per batch, not one per request
    assert len(await store.jobs_by_status(JobStatus.QUEUED)) == 500


async def test_one_bad_request_does_not_lose_the_others(store: Store) -> None:
    await store.add_jobs([job("dup")])
    before = store.stats
    # Queued before the writer runs, so they land in one batch.
    good = [store.submit_nowait([InsertJobs((job(f"g{i}"),))]) for i in range(50)]
    bad = store.submit_nowait([InsertJobs((job("dup"),))])
    good += [store.submit_nowait([InsertJobs((job(f"h{i}"),))]) for i in range(50)]
    results = await asyncio.gather(*good, bad, return_exceptions=True)

    assert results[:-1] == [True] * 100
    assert isinstance(results[-1], ConstraintViolationError)
    after = store.stats
    assert after.batches - before.batches == 1
    assert after.isolated_retries - before.isolated_retries == 1
    assert after.failed_requests - before.failed_requests == 1
    assert len(await store.jobs_by_status(JobStatus.QUEUED)) == 101


async def test_a_request_is_atomic(store: Store) -> None:
    with pytest.raises(JobNotFoundError):
        await store.submit([InsertJobs((job("new"),)), UpdateJob("missing", {"preemptions": 1})])
    assert await store.get_job("new") is None


async def test_order_is_kept_across_requests_in_a_batch(store: Store) -> None:
    # The lease references the job inserted by the request queued just before it.
    first = store.submit_nowait([InsertJobs((job("j1"),))])
    second = store.submit_nowait([UpsertLeases((lease("l1", "j1"),))])
    third = store.submit_nowait([UpdateJob("j1", {"status": JobStatus.RUNNING}, expected_version=1)])
    fourth = store.submit_nowait([DeleteLeases(("l1",)), UpsertLeases((lease("l1", "j1", "node-9"),))])
    assert await asyncio.gather(first, second, third, fourth) == [True] * 4
    assert [x.node_id for x in await store.leases_for_job("j1")] == ["node-9"]


async def test_same_lease_upserted_twice_in_one_batch(store: Store) -> None:
    await store.add_jobs([job("j1")])
    futures = [store.submit_nowait([UpsertLeases((lease("l1", "j1", gpu_indices=(i,)),))]) for i in range(4)]
    await asyncio.gather(*futures)
    assert [x.gpu_indices for x in await store.leases_for_job("j1")] == [(3,)]


# --- optimistic concurrency ------------------------------------------------------------------------------


async def test_version_conflict_raises_stale_write(store: Store) -> None:
    await store.add_jobs([job("j1")])
    winner = store.update_job("j1", {"status": JobStatus.RUNNING}, expected_version=1)
    loser = store.update_job("j1", {"status": JobStatus.CANCELLED}, expected_version=1)
    results = await asyncio.gather(winner, loser, return_exceptions=True)

    assert results[0] is None
    err = results[1]
    assert isinstance(err, StaleWriteError)
    assert (err.job_id, err.expected_version, err.actual_version) == ("j1", 1, 2)
    got = await store.get_job("j1")
    assert got is not None
    assert (got.status, got.version) == (JobStatus.RUNNING, 2)


async def test_stale_update_in_a_bulk_batch_fails_alone(store: Store) -> None:
    await store.add_jobs([job(f"j{i}") for i in range(20)])
    # Same update shape for all, so the writer folds them into one bulk UPDATE; j7's version is wrong.
    futures = [
        store.submit_nowait([UpdateJob(f"j{i}", {"preemptions": 1}, expected_version=5 if i == 7 else 1)])
        for i in range(20)
    ]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert [type(r).__name__ for r in results].count("StaleWriteError") == 1
    assert isinstance(results[7], StaleWriteError)
    versions = {j.job_id: j.version for j in await store.active_jobs()}
    assert versions == {f"j{i}": 1 if i == 7 else 2 for i in range(20)}


# --- lifecycle -------------------------------------------------------------------------------------------


async def test_close_flushes_queued_writes_and_reopen_sees_them(store_factory: StoreFactory) -> None:
    first = await store_factory.open(StoreConfig(max_batch_rows=64))
    futures = [first.submit_nowait([InsertJobs((job(f"j{i}"),))]) for i in range(300)]
    await first.close()
    assert all(f.done() and f.result() is True for f in futures)
    with pytest.raises(StoreClosedError):
        await first.add_jobs([job("late")])

    with pytest.raises(StoreClosedError):
        await first.get_job("j1")

    second = await store_factory.open()
    assert len(await second.active_jobs()) == 300
    got = await second.get_job("j299")
    assert isinstance(got, JobRecord)
    assert got.version == 1


async def test_pipelined_events_apply_in_queue_order(store: Store) -> None:
    # A consumer queues a fetched batch in delivery order (one redelivered twice), then awaits each.
    await store.add_jobs([job("j1")])
    deliveries = [("e1", 1), ("e2", 2), ("e1", 1), ("e3", 3)]
    futures = [
        store.apply_event_nowait(event, "scheduler", [UpdateJob("j1", {"iterations_done": n}, expected_version=n)])
        for event, n in deliveries
    ]
    assert [await f for f in futures] == [True, True, False, True]
    got = await store.get_job("j1")
    assert got is not None
    assert (got.iterations_done, got.version) == (3, 4)
