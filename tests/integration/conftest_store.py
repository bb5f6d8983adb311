"""Fixtures for the store tests: a real SQLite file per test, and a real PostgreSQL when reachable.

Imported by ``test_store*.py`` (tests/conftest.py belongs to the bus tests). PostgreSQL tests use a
fresh schema per test (``search_path``), dropped afterwards; they skip with the connection errors as
the reason when no server answers (see ``postgres_url``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from schemas.job import JobClass, JobSpec
from services.runtime.store import JobRecord, LeaseRecord, Store, StoreConfig

_CANDIDATES = (
    "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    "postgresql+asyncpg://root@127.0.0.1:5432/test",
)
_probe: list[tuple[str | None, str]] = []  # (url that answered, or None; why not)


async def postgres_url() -> str:
    """The test PostgreSQL's URL, or ``pytest.skip`` with the reason none answered.

    ``ROUNDHOUSE_TEST_POSTGRES`` names one; otherwise the local trust-auth server is tried as
    ``postgres``, then as ``root``. Probed once per session.
    """
    if not _probe:
        _probe.append(await _find_postgres())
    url, reason = _probe[0]
    if url is None:
        pytest.skip(reason)
    return url


async def _find_postgres() -> tuple[str | None, str]:
    try:
        import asyncpg
    except ImportError:
        return None, "asyncpg is not installed (the 'postgres' extra)"
    env = os.environ.get("ROUNDHOUSE_TEST_POSTGRES")
    errors: list[str] = []
    for url in (env,) if env else _CANDIDATES:
        try:
            conn = await asyncpg.connect(_dsn(url), timeout=3)
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            errors.append(f"{url}: {type(exc).__name__}: {exc}")
        else:
            await conn.close()
            return url, ""
    return None, "no PostgreSQL reachable (" + "; ".join(errors) + ")"


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(_dsn(url), timeout=5)
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
    url = await postgres_url()
    schema = f"rh_test_{uuid.uuid4().hex[:12]}"
    factory = StoreFactory("postgresql", url, schema)
    try:
        yield factory
    finally:
        await factory.close_all()
        await drop_schema(url, schema)


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
