"""PostgreSQL specifics: tables live in the schema the store was given, and two stores (two
scheduler replicas) on one database fence each other with row versions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction

from services.core.state import JobStatus
from services.runtime.store import StaleWriteError, Store, StoreConfig
from tests.integration.conftest_store import drop_schema, job, postgres_url


@pytest.fixture
async def pg() -> AsyncIterator[tuple[str, str]]:
    """(URL, fresh schema name) on the test PostgreSQL; the schema is dropped afterwards."""
    url = await postgres_url()
    schema = f"rh_test_{uuid.uuid4().hex[:12]}"
    try:
        yield url, schema
    finally:
        await drop_schema(url, schema)


async def test_tables_are_created_in_the_given_schema(pg: tuple[str, str]) -> None:
    url, pg_schema = pg
    import asyncpg

    store = await Store.open(url, schema=pg_schema)
    try:
        assert store.backend == "postgresql"
        assert await store.sqlite_settings() == {}
        await store.add_jobs([job("j1")])
    finally:
        await store.close()
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"), timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1", pg_schema
        )
        assert [r["table_name"] for r in rows] == ["applied_events", "jobs", "leases", "meta", "rounds"]
        assert await conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".jobs') == 1
    finally:
        await conn.close()


async def test_two_replicas_fence_each_other_with_versions(pg: tuple[str, str]) -> None:
    url, pg_schema = pg
    old_leader = await Store.open(url, schema=pg_schema)
    new_leader = await Store.open(url, schema=pg_schema)
    try:
        await new_leader.add_jobs([job("j1")])
        seen = await old_leader.get_job("j1")
        assert seen is not None
        await new_leader.update_job("j1", {"status": JobStatus.RUNNING}, expected_version=seen.version)
        with pytest.raises(StaleWriteError) as caught:
            await old_leader.update_job("j1", {"status": JobStatus.CANCELLED}, expected_version=seen.version)
        assert caught.value.actual_version == 2
        # Meanwhile both can claim events; each (consumer, event) is applied once across replicas.
        claims = await asyncio.gather(
            old_leader.apply_event("e1", "scheduler", []), new_leader.apply_event("e1", "scheduler", [])
        )
        assert sorted(claims) == [False, True]
    finally:
        await old_leader.close()
        await new_leader.close()


async def test_replicas_starting_together_create_the_tables_once(pg: tuple[str, str]) -> None:
    url, pg_schema = pg
    stores = await asyncio.gather(*(Store.open(url, schema=pg_schema) for _ in range(4)))
    try:
        await stores[0].add_jobs([job("j1")])
        assert [await s.get_job("j1") for s in stores] == [job("j1")] * 4
        assert await stores[3].get_meta("schema_version") is not None
    finally:
        for store in stores:
            await store.close()


async def _frozen_in_a_write(store: Store, job_id: str) -> tuple[AsyncConnection, AsyncTransaction]:
    """A connection of ``store`` that locked ``job_id``'s row in a transaction and then went quiet,
    as a scheduler frozen (SIGSTOP) between two statements of a write looks to the server."""
    conn = await store._engine.connect()  # the store has no API to hold a transaction open
    transaction = await conn.begin()
    await conn.execute(text("SELECT 1 FROM jobs WHERE job_id = :job FOR UPDATE"), {"job": job_id})
    return conn, transaction


async def test_a_replica_frozen_inside_a_write_does_not_block_the_one_that_took_over(pg: tuple[str, str]) -> None:
    url, pg_schema = pg
    frozen = await Store.open(url, schema=pg_schema, config=StoreConfig(postgres_idle_in_transaction_s=1.0))
    leader = await Store.open(url, schema=pg_schema)
    try:
        await leader.add_jobs([job("j1")])
        conn, _ = await _frozen_in_a_write(frozen, "j1")
        # The server ends the frozen session after its idle bound; the leader's write then goes
        # through. Without the bound it would wait for as long as the other replica is frozen.
        await asyncio.wait_for(leader.update_job("j1", {"status": JobStatus.RUNNING}, expected_version=1), 60)
        stored = await leader.get_job("j1")
        assert stored is not None
        assert stored.status is JobStatus.RUNNING
        with pytest.raises(DBAPIError):  # it wakes up to find its transaction gone: nothing of it is written
            await conn.execute(text("UPDATE jobs SET status = 'cancelled' WHERE job_id = 'j1'"))
        await conn.close()
        assert (await leader.get_job("j1")).status is JobStatus.RUNNING  # type: ignore[union-attr]
    finally:
        await frozen.close()
        await leader.close()


async def test_without_the_idle_bound_a_frozen_write_blocks_the_leader(pg: tuple[str, str]) -> None:
    """The positive control of the test above: the row lock it relies on really blocks a writer."""
    url, pg_schema = pg
    frozen = await Store.open(url, schema=pg_schema, config=StoreConfig(postgres_idle_in_transaction_s=0))
    leader = await Store.open(url, schema=pg_schema)
    try:
        await leader.add_jobs([job("j1")])
        conn, transaction = await _frozen_in_a_write(frozen, "j1")
        write = asyncio.ensure_future(leader.update_job("j1", {"status": JobStatus.RUNNING}, expected_version=1))
        done, _ = await asyncio.wait([write], timeout=3)
        assert not done, "the write went through a row lock held by another session"
        await transaction.rollback()  # the frozen replica wakes up and gives up
        await conn.close()
        await asyncio.wait_for(write, 60)
        assert (await leader.get_job("j1")).status is JobStatus.RUNNING  # type: ignore[union-attr]
    finally:
        await frozen.close()
        await leader.close()
