"""``Store``: the scheduler's persistent jobs, leases, rounds and applied event ids.

Reads run on pooled connections and see every write whose ``await`` has returned. Writes go through
one ``BatchWriter`` task (see ``writer.py``), which turns many concurrent small writes into few
transactions; each caller's request stays atomic and fails alone.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from types import TracebackType

from sqlalchemy import Select, insert, select, text, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from services.core.state import JobStatus
from services.runtime.store.codec import job_from_row, lease_from_row, round_from_row
from services.runtime.store.engine import WRITER_OPTIONS, StoreConfig, create_engine, resolve_target
from services.runtime.store.errors import SchemaVersionError, StoreClosedError, StoreConfigError
from services.runtime.store.migrations import can_upgrade, upgrade
from services.runtime.store.ops import (
    AppliedMark,
    DeleteLeases,
    InsertJobs,
    PruneAppliedEvents,
    RecordRound,
    SetMeta,
    Statements,
    UpdateJob,
    UpsertLeases,
    WriteOp,
    compile_ops,
)
from services.runtime.store.records import (
    JobChanges,
    JobRecord,
    LeaseRecord,
    LeaseState,
    RoundRecord,
    WriterStats,
)
from services.runtime.store.tables import (
    SCHEMA_VERSION,
    AppliedEventRow,
    Base,
    JobRow,
    LeaseRow,
    MetaRow,
    RoundRow,
    meta_table,
)
from services.runtime.store.term import TERM_KEY, claim_term
from services.runtime.store.writer import BatchWriter

_ACTIVE = tuple(s.value for s in JobStatus if not s.is_final)
_SCHEMA_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


class Store:
    """Persistent scheduler state on SQLite (a data directory) or PostgreSQL (a URL).

    Open with ``await Store.open(...)`` and close with ``await store.close()`` (or ``async with``).
    """

    def __init__(self, engine: AsyncEngine, writer: BatchWriter, url: URL) -> None:
        """Use ``Store.open``; this only wires already-prepared parts together."""
        self._engine = engine
        self._writer = writer
        self._url = url
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._closed = False

    @classmethod
    async def open(
        cls,
        target: str | os.PathLike[str],
        *,
        config: StoreConfig | None = None,
        schema: str | None = None,
    ) -> Store:
        """Open (creating if needed) the store at ``target`` and start its writer.

        ``target`` is a data directory (SQLite file ``roundhouse.db`` inside it, WAL mode) or a
        database URL such as ``postgresql+asyncpg://user@host:5432/roundhouse``. ``schema`` puts the
        tables in that PostgreSQL schema (created if missing), e.g. one per deployment or test run.
        """
        config = config or StoreConfig()
        url = resolve_target(target)
        if schema is not None and (not schema or not set(schema) <= _SCHEMA_NAME_CHARS or schema[0].isdigit()):
            raise StoreConfigError(f"schema name {schema!r} must be lower-case letters, digits and _")
        engine = create_engine(url, config, schema=schema)
        try:
            await _prepare_schema_when_unlocked(engine, url, schema, config.busy_timeout_s)
        except BaseException:
            await engine.dispose()
            raise
        writer = BatchWriter(engine, Statements(engine.dialect), config)
        writer.start()
        return cls(engine, writer, url)

    async def close(self) -> None:
        """Commit every write queued so far, stop the writer and release connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._writer.close()
        finally:
            await self._engine.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._url.render_as_string(hide_password=True)

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._engine.dialect.name

    @property
    def stats(self) -> WriterStats:
        """A snapshot of the writer's counters (transactions, batches, requests, rows, retries)."""
        return self._writer.stats

    # --- reads --------------------------------------------------------------------------------------
    def _session(self) -> AsyncSession:
        if self._closed:
            raise StoreClosedError("the store is closed; open a new Store to read")
        return self._sessions()

    async def get_job(self, job_id: str) -> JobRecord | None:
        async with self._session() as session:
            row = await session.get(JobRow, job_id)
            return None if row is None else job_from_row(row)

    async def jobs_by_status(self, *statuses: JobStatus) -> list[JobRecord]:
        """Jobs in any of ``statuses``, oldest submission first."""
        if not statuses:
            return []
        stmt = (
            select(JobRow)
            .where(JobRow.status.in_([s.value for s in statuses]))
            .order_by(JobRow.submit_time, JobRow.job_id)
        )
        async with self._session() as session:
            return [job_from_row(r) for r in (await session.scalars(stmt)).all()]

    async def active_jobs(self) -> list[JobRecord]:
        """Jobs not in a final status (held, queued, running): what a new leader reloads."""
        return await self.jobs_by_status(*(JobStatus(s) for s in _ACTIVE))

    async def leases_for_node(self, node_id: str, *, include_released: bool = False) -> list[LeaseRecord]:
        stmt = select(LeaseRow).where(LeaseRow.node_id == node_id)
        return await self._leases(stmt, include_released)

    async def leases_for_job(self, job_id: str, *, include_released: bool = False) -> list[LeaseRecord]:
        stmt = select(LeaseRow).where(LeaseRow.job_id == job_id)
        return await self._leases(stmt, include_released)

    async def _leases(self, stmt: Select[LeaseRow], include_released: bool) -> list[LeaseRecord]:
        if not include_released:
            stmt = stmt.where(LeaseRow.state != LeaseState.RELEASED.value)
        async with self._session() as session:
            rows = (await session.scalars(stmt.order_by(LeaseRow.granted_at, LeaseRow.lease_id))).all()
            return [lease_from_row(r) for r in rows]

    async def last_round(self) -> RoundRecord | None:
        stmt = select(RoundRow).order_by(RoundRow.round_number.desc()).limit(1)
        async with self._session() as session:
            row = (await session.scalars(stmt)).first()
            return None if row is None else round_from_row(row)

    async def is_applied(self, event_id: str | uuid.UUID, consumer: str) -> bool:
        """Whether ``consumer`` has applied ``event_id`` (committed)."""
        async with self._session() as session:
            row = await session.get(AppliedEventRow, (consumer, str(event_id)))
            return row is not None

    async def claim_term(self, candidate: int) -> int:
        """Claim a leadership term: an epoch above every epoch claimed before (``term.py``), even
        when ``candidate`` (the election's own counter) started again after NATS lost its data.
        Then fence this store to it: every later write fails once a newer term is claimed."""
        epoch = await claim_term(self._engine, candidate)
        self._writer.fence = epoch
        return epoch

    async def term(self) -> int:
        """The epoch of the last term claimed in this store (0 if none)."""
        value = await self.get_meta(TERM_KEY)
        return int(value) if value is not None else 0

    async def get_meta(self, key: str) -> str | None:
        async with self._session() as session:
            row = await session.get(MetaRow, key)
            return None if row is None else row.value

    async def sqlite_settings(self) -> dict[str, str]:
        """The SQLite pragmas a pooled connection runs with (journal_mode, synchronous, ...), for
        diagnostics and tests; empty on PostgreSQL."""
        if self.backend != "sqlite":
            return {}
        if self._closed:
            raise StoreClosedError("the store is closed; open a new Store to read")
        settings: dict[str, str] = {}
        async with self._engine.connect() as conn:
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout", "wal_autocheckpoint"):
                settings[name] = str((await conn.exec_driver_sql(f"PRAGMA {name}")).scalar_one())
        return settings

    # --- writes ---------------------------------------------------------------------------------------
    def submit_nowait(self, ops: Iterable[WriteOp]) -> asyncio.Future[bool]:
        """Queue ``ops`` as one atomic request without waiting; the future resolves (True) once
        committed, or to the request's exception. Requests commit in the order they were queued.
        For producers that pipeline many requests; most callers want ``submit``."""
        return self._writer.enqueue(compile_ops(ops), None)

    async def submit(self, ops: Iterable[WriteOp]) -> None:
        """Write ``ops`` atomically (all or none), batched with other callers' writes.

        Raises the request's own error: ``StaleWriteError``, ``JobNotFoundError``,
        ``ConstraintViolationError``; other requests in the same batch are unaffected.
        """
        await self._writer.enqueue(compile_ops(ops), None)

    def apply_event_nowait(
        self,
        event_id: str | uuid.UUID,
        consumer: str,
        ops: Sequence[WriteOp],
        *,
        applied_at: float | None = None,
    ) -> asyncio.Future[bool]:
        """``apply_event`` without waiting: queue it now, await the future later.

        Requests commit in the order they were queued, so a consumer can queue every message of a
        fetched batch in delivery order, then await and ack each in turn: the effects are those of
        applying them one by one, at the cost of one transaction for the lot.
        """
        mark = AppliedMark(consumer, str(event_id), time.time() if applied_at is None else applied_at)
        return self._writer.enqueue(compile_ops(ops), mark)

    async def apply_event(
        self,
        event_id: str | uuid.UUID,
        consumer: str,
        ops: Sequence[WriteOp],
        *,
        applied_at: float | None = None,
    ) -> bool:
        """Apply an event's effects and mark it applied by ``consumer``, in one transaction.

        Returns False, writing nothing, when ``consumer`` already applied ``event_id``: a JetStream
        redelivery is then acked without being applied twice. If the ops fail, the event is not
        marked either, so a redelivery tries again.
        """
        return await self.apply_event_nowait(event_id, consumer, ops, applied_at=applied_at)

    async def add_jobs(self, jobs: Iterable[JobRecord]) -> None:
        await self.submit([InsertJobs(tuple(jobs))])

    async def update_job(self, job_id: str, changes: JobChanges, *, expected_version: int | None = None) -> None:
        """Set ``changes`` on a job and bump its version (``expected_version + 1`` when given).

        With ``expected_version``, raises ``StaleWriteError`` if the job moved on meanwhile.
        """
        await self.submit([UpdateJob(job_id, changes, expected_version)])

    async def upsert_leases(self, leases: Iterable[LeaseRecord]) -> None:
        await self.submit([UpsertLeases(tuple(leases))])

    async def delete_leases(self, lease_ids: Iterable[str]) -> None:
        await self.submit([DeleteLeases(tuple(lease_ids))])

    async def record_round(self, rnd: RoundRecord) -> None:
        await self.submit([RecordRound(rnd)])

    async def set_meta(self, key: str, value: str) -> None:
        await self.submit([SetMeta(key, value)])

    async def prune_applied_events(self, *, older_than: float, consumer: str | None = None) -> None:
        """Forget applied event ids older than ``older_than``; keep them for longer than JetStream
        can redeliver (the stream's max age / dedup window)."""
        await self.submit([PruneAppliedEvents(older_than, consumer)])


_STARTUP_LOCK = 0x52_48_53_54_4F_52_45
"""PostgreSQL advisory lock key held while creating tables, so replicas starting together do not
race on CREATE TABLE."""


async def _prepare_schema_when_unlocked(engine: AsyncEngine, url: URL, schema: str | None, timeout_s: float) -> None:
    """``_prepare_schema``, retried for up to ``timeout_s`` while SQLite says the file is locked.

    A connection's first statement switches a file still in rollback-journal mode (new, or written
    by an older tool) to WAL, and SQLite fails that at once, without waiting on ``busy_timeout``,
    while another process holds the file's write lock, e.g. a second service upgrading it as both
    start. The failed attempt changed nothing; once the holder commits the file is in WAL mode and
    the retry goes through.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            await _prepare_schema(engine, url, schema)
            return
        except OperationalError as exc:
            if engine.dialect.name != "sqlite" or "database is locked" not in str(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)


async def _prepare_schema(engine: AsyncEngine, url: URL, schema: str | None) -> None:
    """Create what is missing, then record the schema version, upgrade an older database
    (``migrations.py``) or refuse a newer one, in one transaction."""
    async with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            # Take the write lock up front, as the writer does: two processes opening an old file
            # together then upgrade it one after the other, instead of the second failing on a
            # lock upgrade (SQLITE_BUSY) after it read the old version.
            await conn.execution_options(**WRITER_OPTIONS)
        async with conn.begin():
            if engine.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _STARTUP_LOCK})
            if schema is not None:
                await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            await conn.run_sync(Base.metadata.create_all)
            found = (
                await conn.execute(select(meta_table.c.value).where(meta_table.c.key == "schema_version"))
            ).scalar_one_or_none()
            if found is None:
                await conn.execute(insert(meta_table).values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif found != str(SCHEMA_VERSION):
                if not can_upgrade(found):
                    raise SchemaVersionError(found, SCHEMA_VERSION, url.render_as_string(hide_password=True))
                await upgrade(conn, found)
                await conn.execute(
                    update(meta_table).where(meta_table.c.key == "schema_version").values(value=str(SCHEMA_VERSION))
                )
