"""PostgreSQL specifics: tables live in the schema the store was given, and two stores (two
scheduler replicas) on one database fence each other with row versions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from services.core.state import JobStatus
from services.runtime.store import StaleWriteError, Store
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
