"""SQLite specifics: the data directory, WAL and pragmas, several writers on one file, durability of
a commit when the process dies right after it, and the schema-version guard."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.core.state import JobStatus
from services.runtime.store import DB_FILENAME, SchemaVersionError, Store, StoreConfig
from tests.integration.conftest_store import job

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> Store:
    return await Store.open(tmp_path / "data")


async def test_data_directory_is_created_with_the_database_file(tmp_path: Path) -> None:
    data = tmp_path / "nested" / "data"
    store = await Store.open(data)
    try:
        assert store.backend == "sqlite"
        assert store.url == f"sqlite+aiosqlite:///{data.resolve() / DB_FILENAME}"
        await store.add_jobs([job("j1")])
    finally:
        await store.close()
    assert (data / DB_FILENAME).is_file()


async def test_every_pooled_connection_runs_wal_and_the_pragmas(tmp_path: Path) -> None:
    store = await Store.open(tmp_path, config=StoreConfig(busy_timeout_s=2.5, sqlite_wal_autocheckpoint=500))
    try:
        # Several at once, so the pool opens several connections.
        settings = await asyncio.gather(*(store.sqlite_settings() for _ in range(4)))
    finally:
        await store.close()
    expected = {
        "journal_mode": "wal",
        "synchronous": "1",  # NORMAL
        "foreign_keys": "1",
        "busy_timeout": "2500",
        "wal_autocheckpoint": "500",
    }
    assert settings == [expected] * 4
    # WAL is a property of the file: a plain sqlite3 connection sees it too.
    with sqlite3.connect(tmp_path / DB_FILENAME) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_synchronous_is_configurable(tmp_path: Path) -> None:
    store = await Store.open(tmp_path, config=StoreConfig(sqlite_synchronous="full"))
    try:
        assert (await store.sqlite_settings())["synchronous"] == "2"
    finally:
        await store.close()


async def test_two_stores_on_one_file_both_commit(tmp_path: Path) -> None:
    # Two processes' worth of writers contend for SQLite's write lock; BEGIN IMMEDIATE plus the busy
    # timeout make them take turns instead of failing.
    a = await Store.open(tmp_path)
    b = await Store.open(tmp_path)
    try:
        await asyncio.gather(
            *(a.add_jobs([job(f"a{i}")]) for i in range(200)),
            *(b.add_jobs([job(f"b{i}")]) for i in range(200)),
        )
        assert len(await a.jobs_by_status(JobStatus.QUEUED)) == 400
    finally:
        await a.close()
        await b.close()


async def test_a_write_is_durable_once_its_await_returns(tmp_path: Path) -> None:
    # The contract consumers rely on (ack after commit): the child awaits a write, then dies without
    # closing anything. Everything it awaited must be there; what it never awaited need not be.
    child = textwrap.dedent(
        f"""
        import asyncio, os
        from services.runtime.store import Store
        from tests.integration.conftest_store import job

        async def main():
            store = await Store.open({str(tmp_path)!r})
            await store.add_jobs([job("acked-1"), job("acked-2")])
            await store.update_job("acked-1", {{"preemptions": 3}}, expected_version=1)
            os._exit(0)

        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", child, cwd=REPO_ROOT, stderr=subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, stderr.decode()

    store = await Store.open(tmp_path)
    try:
        acked = await store.get_job("acked-1")
        assert acked is not None
        assert (acked.preemptions, acked.version) == (3, 2)
        assert await store.get_job("acked-2") is not None
    finally:
        await store.close()


async def test_refuses_a_database_from_another_schema_version(tmp_path: Path) -> None:
    store = await Store.open(tmp_path)
    await store.set_meta("schema_version", "999")
    await store.close()
    with pytest.raises(SchemaVersionError, match="schema version 999"):
        await Store.open(tmp_path)


async def test_close_is_idempotent(sqlite_store: Store) -> None:
    await sqlite_store.close()
    await sqlite_store.close()
    assert sqlite_store.stats.requests == 0


async def test_async_context_manager_closes(tmp_path: Path) -> None:
    async with await Store.open(tmp_path) as store:
        await store.add_jobs([job("j1")])
    async with await Store.open(tmp_path) as again:
        assert await again.get_job("j1") == job("j1")
