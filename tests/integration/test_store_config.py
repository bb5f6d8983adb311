"""Store targets, options and the public surface (no database needed except where noted)."""

from __future__ import annotations

from pathlib import Path

import pytest

import services.runtime.store as store_pkg
from schemas.job import JobClass, JobSpec
from services.core.state import JobState, JobStatus
from services.runtime.store import (
    DB_FILENAME,
    InsertJobs,
    JobRecord,
    Store,
    StoreConfig,
    StoreConfigError,
    resolve_target,
)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param("postgresql+asyncpg://u:pw@db:5432/rh", "postgresql+asyncpg://u:***@db:5432/rh", id="asyncpg"),
        pytest.param("postgresql://u@db/rh", "postgresql+asyncpg://u@db/rh", id="pg-no-driver"),
        pytest.param("postgres://u@db/rh", "postgresql+asyncpg://u@db/rh", id="pg-alias"),
        pytest.param("postgresql+psycopg://u@db/rh", "postgresql+asyncpg://u@db/rh", id="pg-sync-driver"),
        pytest.param("sqlite:////var/lib/rh/x.db", "sqlite+aiosqlite:////var/lib/rh/x.db", id="sqlite-url"),
    ],
)
def test_urls_get_the_async_driver(target: str, expected: str) -> None:
    assert resolve_target(target).render_as_string(hide_password=True) == expected


@pytest.mark.parametrize(
    ("target", "match"),
    [
        pytest.param("sqlite://", "in-memory", id="sqlite-memory-default"),
        pytest.param("sqlite:///:memory:", "in-memory", id="sqlite-memory"),
        pytest.param("mysql://u@db/rh", "unsupported database 'mysql'", id="mysql"),
        pytest.param("", "empty store target", id="empty"),
    ],
)
def test_unusable_targets_are_refused(target: str, match: str) -> None:
    with pytest.raises(StoreConfigError, match=match):
        resolve_target(target)


def test_a_path_is_a_data_directory(tmp_path: Path) -> None:
    url = resolve_target(tmp_path / "d")
    assert url.drivername == "sqlite+aiosqlite"
    assert url.database == str((tmp_path / "d").resolve() / DB_FILENAME)
    assert (tmp_path / "d").is_dir()


def test_a_file_is_not_a_data_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreConfigError, match="not a directory"):
        resolve_target(tmp_path / "f")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        pytest.param({"max_batch_rows": 0}, "max_batch_rows", id="batch"),
        pytest.param({"linger_s": -1.0}, "linger_s", id="linger"),
        pytest.param({"sqlite_synchronous": "sometimes"}, "sqlite_synchronous", id="synchronous"),
        pytest.param({"busy_timeout_s": -1.0}, "busy_timeout_s", id="busy"),
        pytest.param({"sqlite_wal_autocheckpoint": -5}, "sqlite_wal_autocheckpoint", id="checkpoint"),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(StoreConfigError, match=match):
        StoreConfig(**kwargs)  # type: ignore[arg-type]


async def test_schema_is_postgres_only(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match="PostgreSQL only"):
        await Store.open(tmp_path, schema="rh")


@pytest.mark.parametrize("schema", ["", "Upper", "has-dash", "1st", 'x"; drop'])
async def test_bad_schema_names_are_refused(schema: str) -> None:
    with pytest.raises(StoreConfigError, match="schema name"):
        await Store.open("postgresql+asyncpg://u@127.0.0.1:1/x", schema=schema)


async def test_a_non_operation_is_refused_in_the_caller(tmp_path: Path) -> None:
    async with await Store.open(tmp_path) as store:
        with pytest.raises(TypeError, match="not a store write operation"):
            await store.submit([("insert", "j1")])  # type: ignore[list-item]
        await store.submit([InsertJobs(())])  # empty: nothing to write, still fine
        assert store.stats.failed_requests == 0


def test_public_names_are_exported() -> None:
    assert sorted(store_pkg.__all__) == sorted(set(store_pkg.__all__))
    for name in store_pkg.__all__:
        assert getattr(store_pkg, name) is not None, name
    assert {"Store", "StoreConfig", "StaleWriteError", "JobRecord", "LeaseRecord", "RoundRecord"} <= set(
        store_pkg.__all__
    )


def test_job_record_round_trips_a_job_state() -> None:
    spec = JobSpec(name="t", command=["python"], gpus=2, job_class=JobClass.TE, user="u1")
    state = JobState(
        job_id="j1",
        spec=spec,
        submit_time=1.0,
        status=JobStatus.RUNNING,
        admit_time=2.0,
        first_start_time=3.0,
        last_start_time=5.0,
        last_preempt_time=4.0,
        attained_service=8.0,
        executed_time=4.0,
        iterations_done=40,
        preemptions=1,
        gpus=(4, 5),
        seq=17,
        queued_since=None,
        longest_wait_s=1.5,
    )
    record = JobRecord.from_state(state, checkpoint_path="/c/j1", checkpoint_iteration=30, version=6)
    assert (record.user, record.job_class, record.gpus, record.version) == ("u1", JobClass.TE, 2, 6)
    assert (record.checkpoint_path, record.checkpoint_iteration) == ("/c/j1", 30)
    assert record.to_state(gpus=(4, 5)) == state
