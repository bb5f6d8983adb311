"""A database written by an older Roundhouse opens and is upgraded in place, on both backends.

The version 1 tables are created here with the DDL version 1 ran (SQLAlchemy's ``CREATE TABLE`` for
the version 1 models, copied out of it), rows are written with plain SQL as version 1 wrote them,
and only then does the current ``Store`` open the database.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.core.state import JobStatus
from services.runtime.store import DB_FILENAME, SCHEMA_VERSION, SchemaVersionError, Store
from services.runtime.store.migrations import STEPS, can_upgrade
from tests.integration.conftest_store import _dsn, drop_schema, postgres_url, spec

# The jobs and meta tables of schema version 1 (the tables version 2 left alone are created by the
# store itself, as on any open).
V1_DDL = (
    """CREATE TABLE jobs (
        job_id VARCHAR(64) NOT NULL, spec TEXT NOT NULL, status VARCHAR(16) NOT NULL,
        user_name VARCHAR(64) NOT NULL, job_class VARCHAR(8) NOT NULL, gpus BIGINT NOT NULL,
        submit_time FLOAT NOT NULL, admit_time FLOAT, first_start_time FLOAT, last_start_time FLOAT,
        last_preempt_time FLOAT, finish_time FLOAT, attained_service FLOAT NOT NULL,
        executed_time FLOAT NOT NULL, iterations_done BIGINT NOT NULL, preemptions BIGINT NOT NULL,
        checkpoint_path TEXT, seq BIGINT NOT NULL, queued_since FLOAT, longest_wait_s FLOAT NOT NULL,
        version BIGINT NOT NULL, CONSTRAINT pk_jobs PRIMARY KEY (job_id))""",
    "CREATE INDEX ix_jobs_status ON jobs (status)",
    """CREATE TABLE meta ("key" VARCHAR(64) NOT NULL, value TEXT NOT NULL, CONSTRAINT pk_meta PRIMARY KEY ("key"))""",
    """INSERT INTO meta ("key", value) VALUES ('schema_version', '1')""",
)

# (job id, status, iterations_done, checkpoint_path) as version 1 stored them.
V1_JOBS = (
    ("suspended", "queued", 40, "/ckpt/suspended"),  # requeued after a suspension with a checkpoint
    ("fresh", "queued", 0, None),  # never ran
    ("running", "running", 25, "/ckpt/running"),  # resumed from its checkpoint at 25, running now
    ("done", "completed", 100, "/ckpt/done"),  # finished: its last checkpoint may be older than 100
)


def v1_insert(job_id: str, status: str, iterations: int, path: str | None) -> tuple[str, tuple[object, ...]]:
    """The INSERT of one version 1 job row (``?`` placeholders; PostgreSQL gets ``$n``)."""
    row = (job_id, spec(job_id).model_dump_json(), status, "alice", "BE", 1, 1.0, 2.0, None, None, None,
           None, 0.0, 0.0, iterations, 1, path, 1, None, 0.0, 3)  # fmt: skip
    return "INSERT INTO jobs VALUES (" + ", ".join("?" * len(row)) + ")", row


@dataclass
class OldDatabase:
    """A version 1 database and how to open it with the current store."""

    target: str
    schema: str | None

    async def open(self) -> Store:
        return await Store.open(self.target, schema=self.schema)


def _sqlite_v1(path: Path) -> None:
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        for statement in V1_DDL:
            db.execute(statement)
        for job in V1_JOBS:
            db.execute(*v1_insert(*job))


async def _postgres_v1(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_dsn(url), timeout=5)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        await conn.execute(f'SET search_path TO "{schema}"')
        for statement in V1_DDL:
            await conn.execute(statement)
        for job in V1_JOBS:
            sql, row = v1_insert(*job)
            for n in range(1, len(row) + 1):
                sql = sql.replace("?", f"${n}", 1)
            await conn.execute(sql, *row)
    finally:
        await conn.close()


@pytest.fixture(params=["sqlite", "postgresql"])
async def old_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OldDatabase]:
    if request.param == "sqlite":
        _sqlite_v1(tmp_path / "data" / DB_FILENAME)
        yield OldDatabase(str(tmp_path / "data"), None)
        return
    url = await postgres_url()
    schema = f"rh_test_{uuid.uuid4().hex[:12]}"
    try:
        await _postgres_v1(url, schema)
        yield OldDatabase(url, schema)
    finally:
        await drop_schema(url, schema)


async def test_a_version_1_database_opens_and_gets_checkpoint_iterations(old_db: OldDatabase) -> None:
    store = await old_db.open()
    try:
        assert await store.get_meta("schema_version") == str(SCHEMA_VERSION)
        jobs = {job_id: await store.get_job(job_id) for job_id, *_ in V1_JOBS}
        # Unfinished jobs: version 1 stored iterations_done only with the checkpoint, so it is the
        # checkpoint's iteration. A finished job's is left unknown; a job without a checkpoint has none.
        got = {job_id: (r.checkpoint_path, r.checkpoint_iteration) for job_id, r in jobs.items() if r is not None}
        assert got == {
            "suspended": ("/ckpt/suspended", 40),
            "fresh": (None, None),
            "running": ("/ckpt/running", 25),
            "done": ("/ckpt/done", None),
        }
        suspended = jobs["suspended"]
        assert suspended is not None
        assert (suspended.status, suspended.iterations_done, suspended.version) == (JobStatus.QUEUED, 40, 3)
        assert suspended.spec == spec("suspended")
        # The new column is written like any other.
        await store.update_job("suspended", {"checkpoint_iteration": 45, "iterations_done": 45}, expected_version=3)
        assert {r.job_id for r in await store.active_jobs()} == {"suspended", "fresh", "running"}
    finally:
        await store.close()
    again = await old_db.open()  # already upgraded: opens as is
    try:
        record = await again.get_job("suspended")
        assert record is not None
        assert (record.checkpoint_iteration, record.version) == (45, 4)
    finally:
        await again.close()


async def test_an_old_database_gets_failure_details_columns(old_db: OldDatabase) -> None:
    """Version 3 (issue 14): a job's reason, exit code and signal are stored; jobs finished before
    the upgrade have none."""
    store = await old_db.open()
    try:
        done = await store.get_job("done")
        assert done is not None
        assert (done.reason, done.exit_code, done.signal) == (None, None, None)
        failed = {"status": JobStatus.FAILED, "reason": "exit code 3 on n0: boom", "exit_code": 3, "signal": None}
        await store.update_job("running", failed, expected_version=3)  # type: ignore[arg-type]
        record = await store.get_job("running")
        assert record is not None
        assert (record.status, record.reason, record.exit_code, record.signal) == (
            JobStatus.FAILED, "exit code 3 on n0: boom", 3, None,
        )  # fmt: skip
    finally:
        await store.close()


async def test_stores_opening_an_old_database_together_upgrade_it_once(old_db: OldDatabase) -> None:
    """Three stores (own engines and connections, as three processes would have) open it at once:
    one upgrades it, the others wait for its lock and find it upgraded (on SQLite this failed
    without ``BEGIN IMMEDIATE``: a reader of version 1 could not then take the write lock)."""
    stores = await asyncio.gather(*(old_db.open() for _ in range(3)))
    try:
        for store in stores:
            record = await store.get_job("suspended")
            assert record is not None
            assert record.checkpoint_iteration == 40
    finally:
        for store in stores:
            await store.close()


async def test_an_old_file_locked_by_another_process_is_opened_once_the_lock_is_gone(tmp_path: Path) -> None:
    """The file is still in rollback-journal mode and another process holds its write lock (as one
    upgrading it would): switching to WAL fails at once, without SQLite's busy wait, so ``open``
    retries until the holder commits (the flaky failure of the test above: 'database is locked')."""
    path = tmp_path / "data" / DB_FILENAME
    _sqlite_v1(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("UPDATE jobs SET iterations_done = 41 WHERE job_id = 'suspended'")
    opening = asyncio.create_task(Store.open(tmp_path / "data"))
    await asyncio.sleep(0.3)
    assert not opening.done()  # waiting for the lock, not failed
    holder.execute("COMMIT")
    holder.close()
    store = await asyncio.wait_for(opening, timeout=5)
    try:
        record = await store.get_job("suspended")
        assert record is not None
        assert (record.iterations_done, record.checkpoint_iteration) == (41, 41)
    finally:
        await store.close()


async def test_a_database_from_a_newer_version_is_still_refused(tmp_path: Path) -> None:
    store = await Store.open(tmp_path)
    await store.set_meta("schema_version", str(SCHEMA_VERSION + 1))
    await store.close()
    with pytest.raises(SchemaVersionError, match=f"schema version {SCHEMA_VERSION + 1}"):
        await Store.open(tmp_path)


@pytest.mark.parametrize(
    ("found", "upgradable"),
    [("1", True), (str(SCHEMA_VERSION), False), (str(SCHEMA_VERSION + 1), False), ("0", False), ("x", False)],
    ids=["oldest", "current", "newer", "zero", "not-a-number"],
)
def test_which_versions_can_be_upgraded(found: str, upgradable: bool) -> None:
    assert can_upgrade(found) is upgradable


def test_every_older_version_has_a_step_to_the_next() -> None:
    assert set(STEPS) == set(range(1, SCHEMA_VERSION))
