"""Leadership terms in the store (SQLite and PostgreSQL): epochs never go back, and a write from a
term that is over fails whole, with nothing of it written (issue 12: fencing, monotonic epochs)."""

from __future__ import annotations

import asyncio

import pytest

from services.core.state import JobStatus
from services.runtime.store import FencedOutError, JobChanges, StaleWriteError, Store, UpdateJob
from tests.integration.conftest_store import StoreFactory, job, store, store_factory

__all__ = ["store", "store_factory"]  # fixtures, imported for pytest


async def test_a_term_s_epoch_is_above_every_epoch_claimed_before(store: Store) -> None:
    assert await store.term() == 0
    assert await store.claim_term(5) == 5
    # The election's counter started again (NATS lost its data): the store's floor wins.
    assert await store.claim_term(1) == 6
    assert await store.claim_term(6) == 7
    assert await store.claim_term(100) == 100
    assert await store.term() == 100


async def test_a_write_of_a_term_that_is_over_fails_whole_and_writes_nothing(store_factory: StoreFactory) -> None:
    old = await store_factory.open()
    new = await store_factory.open()
    await old.add_jobs([job("j1"), job("j2")])
    epoch = await old.claim_term(3)
    await old.update_job("j1", JobChanges(status=JobStatus.QUEUED))  # fenced to its own term: fine
    assert await new.claim_term(3) == epoch + 1
    # The old leader wakes up and writes: the store refuses the whole transaction.
    with pytest.raises(FencedOutError, match=f"epoch {epoch}"):
        await old.submit([UpdateJob("j1", JobChanges(status=JobStatus.RUNNING)),
                          UpdateJob("j2", JobChanges(status=JobStatus.RUNNING))])  # fmt: skip
    j1, j2 = await new.get_job("j1"), await new.get_job("j2")
    assert j1 is not None
    assert j2 is not None
    assert (j1.status, j2.status) == (JobStatus.QUEUED, JobStatus.QUEUED)
    # Every write batched with it fails too (and is a StaleWriteError: the scheduler steps down).
    results = await asyncio.gather(
        old.apply_event("e1", "scheduler-x", [UpdateJob("j1", JobChanges(preemptions=9))]),
        old.submit([UpdateJob("j2", JobChanges(preemptions=9))]),
        return_exceptions=True,
    )
    assert all(isinstance(r, StaleWriteError) for r in results), results
    assert not await new.is_applied("e1", "scheduler-x")
    # The new term writes.
    await new.submit([UpdateJob("j2", JobChanges(status=JobStatus.RUNNING))])
    j2 = await new.get_job("j2")
    assert j2 is not None
    assert j2.status is JobStatus.RUNNING
