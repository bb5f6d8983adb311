"""Fixtures for the store tests: a real SQLite file per test, and a real PostgreSQL when reachable.

Imported by ``test_store*.py`` (tests/conftest.py belongs to the bus tests). PostgreSQL tests use a
fresh schema per test (``search_path``), dropped afterwards; they skip with the connection error as
the reason when no server answers at ``ROUNDHOUSE_TEST_POSTGRES`` (default: the local trust-auth
server at 127.0.0.1:5432, database ``test``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from schemas.job import JobClass, JobSpec
from services.runtime.store import JobRecord, LeaseRecord, Store, StoreConfig

POSTGRES_URL = os.environ.get("ROUNDHOUSE_TEST_POSTGRES", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")

_pg_reason: list[str | None] = []


async def postgres_unreachable() -> str | None:
    """None when the test PostgreSQL accepts connections, else why not (checked once per session)."""
    if not _pg_reason:
        try:
            import asyncpg
        except ImportError:
            _pg_reason.append("asyncpg is not installed (the 'postgres' extra)")
            return _pg_reason[0]
        try:
            conn = await asyncpg.connect(_dsn(POSTGRES_URL), timeout=3)
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            _pg_reason.append(f"no PostgreSQL at {POSTGRES_URL}: {type(exc).__name__}: {exc}")
        else:
            await conn.close()
            _pg_reason.append(None)
    return _pg_reason[0]


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_dsn(POSTGRES_URL), timeout=5)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@dataclass
class StoreFactory:
    """Opens stores on one database (a data directory or a PostgreSQL schema) and closes them all."""

    backend: str
    target: str
    schema: str | None
    opened: list[Store] = field(default_factory=list)

    async def open(self, config: StoreConfig | None = None) -> Store:
        store = await Store.open(self.target, config=config, schema=self.schema)
        self.opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()


OpenStore = Callable[..., Awaitable[Store]]


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreFactory]:
    """A factory per backend: the same test runs on a SQLite file and on PostgreSQL."""
    if request.param == "sqlite":
        factory = StoreFactory("sqlite", str(tmp_path / "data"), None)
        try:
            yield factory
        finally:
            await factory.close_all()
        return
    reason = await postgres_unreachable()
    if reason is not None:
        pytest.skip(reason)
    schema = f"rh_test_{uuid.uuid4().hex[:12]}"
    factory = StoreFactory("postgresql", POSTGRES_URL, schema)
    try:
        yield factory
    finally:
        await factory.close_all()
        await drop_schema(schema)


@pytest.fixture
async def store(store_factory: StoreFactory) -> Store:
    return await store_factory.open()


def spec(name: str = "train", *, user: str = "alice", gpus: int = 1, kind: JobClass = JobClass.BE) -> JobSpec:
    return JobSpec(name=name, user=user, command=["python", "train.py"], gpus=gpus, job_class=kind)


def job(job_id: str, *, gpus: int = 1, kind: JobClass = JobClass.BE, user: str = "alice", **fields: Any) -> JobRecord:
    """A small job builder: ``job("j1", status=JobStatus.RUNNING, gpus=4)``."""
    base = JobRecord(job_id=job_id, spec=spec(job_id, user=user, gpus=gpus, kind=kind), submit_time=0.0)
    return replace(base, **fields)


def lease(lease_id: str, job_id: str, node_id: str = "node-0", **fields: Any) -> LeaseRecord:
    """A small lease builder: ``lease("l1", "j1", "node-2", gpu_indices=(0, 1))``."""
    base = LeaseRecord(lease_id, job_id, node_id, gpu_indices=(0,), epoch=1, granted_at=10.0)
    return replace(base, **fields)
