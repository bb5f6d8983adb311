"""Write operations: what callers submit, and how the writer turns a run of them into bulk statements.

A caller hands the store a list of operations (public frozen dataclasses below). They are compiled
right away into ``Step``s, pre-encoded row tuples plus the runner that writes them, so that a bad
argument fails in the caller and never enters a batch. The writer concatenates the steps of every
request in a batch and merges *consecutive* steps of the same shape into one ``executemany``: order
is preserved, so a job inserted before a lease that references it is still inserted first.

Statements are compiled once per engine into driver SQL with positional parameters (``Prepared``)
and executed with ``exec_driver_sql``: SQLAlchemy still wraps errors and manages the transaction,
but skips per-row parameter processing, which otherwise costs more than SQLite's own insert.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from sqlalchemy import bindparam, delete, insert, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine.interfaces import Dialect as SADialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import ValuesBase

from services.runtime.store.codec import (
    APPLIED_COLUMNS,
    JOB_COLUMNS,
    LEASE_COLUMNS,
    ROUND_COLUMNS,
    RowTuple,
    RowValue,
    changes_to_row,
    job_to_row,
    lease_to_row,
    round_to_row,
)
from services.runtime.store.errors import JobNotFoundError, StaleWriteError, StoreError
from services.runtime.store.records import JobChanges, JobRecord, LeaseRecord, RoundRecord
from services.runtime.store.tables import applied_table, jobs_table, leases_table, meta_table, rounds_table

_IN_CHUNK = 500
"""Keys per ``IN (...)`` list: far below SQLite's and asyncpg's bound-parameter limits."""


# --- public operations ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InsertJobs:
    """Add new jobs; a job id that already exists fails the request (``ConstraintViolationError``)."""

    jobs: tuple[JobRecord, ...]


@dataclass(frozen=True, slots=True)
class UpdateJob:
    """Set the fields in ``changes`` and bump the version.

    With ``expected_version`` the update applies only if the row is still at that version, and
    otherwise fails with ``StaleWriteError`` (optimistic concurrency between scheduler replicas).
    """

    job_id: str
    changes: JobChanges = field(default_factory=JobChanges)
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class UpsertLeases:
    """Insert leases, or replace every field of leases whose id exists."""

    leases: tuple[LeaseRecord, ...]


@dataclass(frozen=True, slots=True)
class DeleteLeases:
    """Remove leases by id (ids not present are ignored)."""

    lease_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecordRound:
    """Persist a decided round; a round number already recorded fails (a stale leader's round)."""

    round: RoundRecord


@dataclass(frozen=True, slots=True)
class SetMeta:
    """Set a key of the ``meta`` table."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class PruneAppliedEvents:
    """Forget applied event ids older than ``older_than`` (beyond the JetStream redelivery horizon)."""

    older_than: float
    consumer: str | None = None


WriteOp: TypeAlias = InsertJobs | UpdateJob | UpsertLeases | DeleteLeases | RecordRound | SetMeta | PruneAppliedEvents


@dataclass(frozen=True, slots=True)
class AppliedMark:
    """The applied-events row an ``apply_event`` request claims before its operations run."""

    consumer: str
    event_id: str
    applied_at: float

    def row(self) -> RowTuple:
        return (self.consumer, self.event_id, self.applied_at)


# --- statements compiled per engine ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prepared:
    """Driver SQL with positional parameters, and the parameter names in position order."""

    sql: str
    params: tuple[str, ...]

    @classmethod
    def compile(cls, stmt: ValuesBase, dialect: SADialect, expect: tuple[str, ...]) -> Prepared:
        compiled = stmt.compile(dialect=dialect)
        names = tuple(compiled.positiontup or ())
        if names != expect:
            raise StoreError(f"{dialect.name}: statement binds {names}, rows are built as {expect}")
        return cls(str(compiled), names)


class Statements:
    """The writer's statements for one engine's dialect (SQLite or PostgreSQL)."""

    def __init__(self, dialect: SADialect) -> None:
        self.name = dialect.name
        self.sane_multi_rowcount = bool(dialect.supports_sane_multi_rowcount)
        """True when an ``executemany`` reports the total rows it changed (SQLite; not asyncpg)."""
        self._dialect = dialect
        if dialect.name == "sqlite":
            make: Callable[..., sqlite.Insert | postgresql.Insert] = sqlite.insert
        elif dialect.name == "postgresql":
            make = postgresql.insert
        else:
            raise StoreError(f"unsupported backend {dialect.name!r}; use SQLite or PostgreSQL")
        self.insert_jobs = Prepared.compile(insert(jobs_table), dialect, JOB_COLUMNS)
        self.insert_rounds = Prepared.compile(insert(rounds_table), dialect, ROUND_COLUMNS)
        self.insert_applied = Prepared.compile(insert(applied_table), dialect, APPLIED_COLUMNS)
        leases = make(leases_table)
        self.upsert_leases = Prepared.compile(
            leases.on_conflict_do_update(
                index_elements=["lease_id"],
                set_={c.name: leases.excluded[c.name] for c in leases_table.c if c.name != "lease_id"},
            ),
            dialect,
            LEASE_COLUMNS,
        )
        meta = make(meta_table)
        self.upsert_meta = Prepared.compile(
            meta.on_conflict_do_update(index_elements=["key"], set_={"value": meta.excluded.value}),
            dialect,
            ("key", "value"),
        )
        self.claim_event = Prepared.compile(
            make(applied_table).on_conflict_do_nothing(index_elements=["consumer", "event_id"]),
            dialect,
            APPLIED_COLUMNS,
        )
        """INSERT ... ON CONFLICT DO NOTHING: rowcount 0 means the event was already applied."""
        self._updates: dict[tuple[tuple[str, ...], bool], Prepared] = {}

    def update_job(self, columns: tuple[str, ...], checked: bool) -> Prepared:
        """``UPDATE jobs SET <columns>, version = version + 1 WHERE job_id = ? [AND version = ?]``."""
        key = (columns, checked)
        prepared = self._updates.get(key)
        if prepared is None:
            stmt = update(jobs_table).where(jobs_table.c.job_id == bindparam("b_job_id"))
            if checked:
                stmt = stmt.where(jobs_table.c.version == bindparam("b_version"))
            values = {
                "version": jobs_table.c.version + literal_column("1"),
                **{c: bindparam(c) for c in columns},
            }
            expect = (*columns, "b_job_id", *(("b_version",) if checked else ()))
            prepared = self._updates[key] = Prepared.compile(stmt.values(values), self._dialect, expect)
        return prepared


# --- compiled steps ------------------------------------------------------------------------------

Runner: TypeAlias = Callable[[AsyncConnection, Statements, list[RowTuple], bool], Awaitable[None]]
"""Writes a run of rows: (connection, statements, rows, exact). ``exact`` asks for per-row errors."""


@dataclass(slots=True)
class Step:
    """Pre-encoded rows and the runner that writes them; steps with equal ``group`` may be merged."""

    run: Runner
    group: Hashable | None
    rows: list[RowTuple]


class AmbiguousConflictError(StoreError):
    """A bulk update changed fewer rows than it named; the writer retries request by request to
    find the one at fault. Never reaches a caller."""


async def _run_insert_jobs(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
    await conn.exec_driver_sql(st.insert_jobs.sql, rows)


async def _run_insert_rounds(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
    await conn.exec_driver_sql(st.insert_rounds.sql, rows)


async def _diagnose_update(conn: AsyncConnection, job_id: str, expected: RowValue) -> None:
    actual = (
        await conn.execute(select(jobs_table.c.version).where(jobs_table.c.job_id == job_id))
    ).scalar_one_or_none()
    if actual is None:
        raise JobNotFoundError(job_id)
    raise StaleWriteError(job_id, int(expected) if expected is not None else -1, int(actual))


def _make_update_runner(columns: tuple[str, ...], checked: bool) -> Runner:
    id_at = len(columns)

    async def run(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
        sql = st.update_job(columns, checked).sql
        if exact or len(rows) == 1 or not st.sane_multi_rowcount:
            for row in rows:
                if (await conn.exec_driver_sql(sql, row)).rowcount != 1:
                    await _diagnose_update(conn, str(row[id_at]), row[id_at + 1] if checked else None)
            return
        result = await conn.exec_driver_sql(sql, rows)
        if result.rowcount != len(rows):
            raise AmbiguousConflictError(f"bulk update changed {result.rowcount} of {len(rows)} jobs")

    return run


_update_runners: dict[tuple[tuple[str, ...], bool], Runner] = {}


def _unique_runs(rows: list[RowTuple]) -> list[list[RowTuple]]:
    """Split rows so no key (first column) repeats within a run. Each run is one ``executemany``;
    should a driver fold that into one multi-row statement, PostgreSQL would refuse an upsert that
    touches a row twice ("ON CONFLICT DO UPDATE command cannot affect row a second time")."""
    runs: list[list[RowTuple]] = [[]]
    seen: set[RowValue] = set()
    for row in rows:
        if row[0] in seen:
            runs.append([])
            seen = set()
        seen.add(row[0])
        runs[-1].append(row)
    return runs


async def _run_upsert_leases(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
    for run in _unique_runs(rows):
        await conn.exec_driver_sql(st.upsert_leases.sql, run)


async def _run_set_meta(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
    for run in _unique_runs(rows):
        await conn.exec_driver_sql(st.upsert_meta.sql, run)


async def _run_delete_leases(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
    ids = [str(r[0]) for r in rows]
    for i in range(0, len(ids), _IN_CHUNK):
        await conn.execute(delete(leases_table).where(leases_table.c.lease_id.in_(ids[i : i + _IN_CHUNK])))


async def _run_prune(conn: AsyncConnection, st: Statements, rows: list[RowTuple], exact: bool) -> None:
    for older_than, consumer in rows:
        stmt = delete(applied_table).where(applied_table.c.applied_at < older_than)
        if consumer is not None:
            stmt = stmt.where(applied_table.c.consumer == consumer)
        await conn.execute(stmt)


_update_columns: dict[tuple[str, ...], tuple[str, ...]] = {}
"""The columns an update sets, in ``JOB_COLUMNS`` order, by the keys of its changes as given."""


def _compile_update(op: UpdateJob) -> Step:
    values = changes_to_row(op.job_id, op.changes)
    given = tuple(values)
    columns = _update_columns.get(given)
    if columns is None:
        columns = _update_columns[given] = tuple(c for c in JOB_COLUMNS if c in values)
    checked = op.expected_version is not None
    row: RowTuple = (*(values[c] for c in columns), op.job_id, *((op.expected_version,) if checked else ()))
    key = (columns, checked)
    runner = _update_runners.get(key)
    if runner is None:
        runner = _update_runners[key] = _make_update_runner(columns, checked)
    return Step(runner, ("update_job", columns, checked), [row])


def _compile_insert_jobs(op: InsertJobs) -> Step | None:
    return Step(_run_insert_jobs, "insert_jobs", [job_to_row(j) for j in op.jobs]) if op.jobs else None


def _compile_upsert_leases(op: UpsertLeases) -> Step | None:
    return Step(_run_upsert_leases, "upsert_leases", [lease_to_row(x) for x in op.leases]) if op.leases else None


def _compile_delete_leases(op: DeleteLeases) -> Step | None:
    return Step(_run_delete_leases, "delete_leases", [(i,) for i in op.lease_ids]) if op.lease_ids else None


def _compile_record_round(op: RecordRound) -> Step:
    return Step(_run_insert_rounds, "insert_rounds", [round_to_row(op.round)])


def _compile_set_meta(op: SetMeta) -> Step:
    return Step(_run_set_meta, "set_meta", [(op.key, op.value)])


def _compile_prune(op: PruneAppliedEvents) -> Step:
    return Step(_run_prune, None, [(op.older_than, op.consumer)])


# One compiler per operation type, looked up by exact type: cheaper than a match on every write.
_COMPILERS: dict[type, Callable[[Any], Step | None]] = {
    InsertJobs: _compile_insert_jobs,
    UpdateJob: _compile_update,
    UpsertLeases: _compile_upsert_leases,
    DeleteLeases: _compile_delete_leases,
    RecordRound: _compile_record_round,
    SetMeta: _compile_set_meta,
    PruneAppliedEvents: _compile_prune,
}


def compile_op(op: WriteOp) -> Step | None:
    """Encode one operation (validating it); None when it writes nothing (an empty list)."""
    compiler = _COMPILERS.get(type(op))
    if compiler is None:
        raise TypeError(f"not a store write operation: {op!r}; use InsertJobs, UpdateJob, UpsertLeases, ...")
    return compiler(op)


def compile_ops(ops: Iterable[WriteOp]) -> list[Step]:
    steps: list[Step] = []
    for op in ops:
        step = compile_op(op)
        if step is not None:
            steps.append(step)
    return steps


async def run_steps(conn: AsyncConnection, st: Statements, steps: Sequence[Step], *, exact: bool) -> None:
    """Execute steps in order, merging consecutive steps of one group into one bulk statement."""
    i = 0
    count = len(steps)
    while i < count:
        step = steps[i]
        rows = step.rows
        j = i + 1
        group = step.group
        if group is not None:
            while j < count and steps[j].group == group:
                if rows is step.rows:
                    rows = list(rows)
                rows.extend(steps[j].rows)
                j += 1
        await step.run(conn, st, rows, exact)
        i = j


class ClaimConflictError(StoreError):
    """A bulk claim met an event id already in ``applied_events`` (a redelivery); the writer retries
    the batch with ``preselect``. Never reaches a caller."""


async def claim_events(
    conn: AsyncConnection, st: Statements, marks: Sequence[AppliedMark | None], *, preselect: bool
) -> list[bool]:
    """Claim the events of a batch with one bulk INSERT. Returns, per request, whether its
    operations should run: False for a repeat of an earlier request in the same batch, and, with
    ``preselect``, for an event already applied (found by one SELECT per consumer).

    Without ``preselect`` (the common case: redeliveries are rare) an event already applied makes
    the INSERT fail with ``ClaimConflictError`` before anything else of the batch ran; the writer
    then retries with ``preselect``. A concurrent writer in another process that claims an id in
    between still makes the INSERT fail, and the writer falls back to ``claim_event`` per request.
    """
    flags = [True] * len(marks)
    applied: set[tuple[str, str]] = set()
    if preselect:
        by_consumer: dict[str, list[str]] = {}
        for mark in marks:
            if mark is not None:
                by_consumer.setdefault(mark.consumer, []).append(mark.event_id)
        for consumer, ids in by_consumer.items():
            for i in range(0, len(ids), _IN_CHUNK):
                stmt = select(applied_table.c.event_id).where(
                    applied_table.c.consumer == consumer, applied_table.c.event_id.in_(ids[i : i + _IN_CHUNK])
                )
                applied.update((consumer, event_id) for event_id in (await conn.execute(stmt)).scalars())
    new_rows: list[RowTuple] = []
    for index, mark in enumerate(marks):
        if mark is None:
            continue
        key = (mark.consumer, mark.event_id)
        if key in applied:
            flags[index] = False
        else:
            applied.add(key)
            new_rows.append(mark.row())
    if new_rows:
        try:
            await conn.exec_driver_sql(st.insert_applied.sql, new_rows)
        except IntegrityError as exc:
            if preselect:
                raise
            raise ClaimConflictError("an event of this batch was applied before") from exc
    return flags


async def claim_event(conn: AsyncConnection, st: Statements, mark: AppliedMark) -> bool:
    """Claim one event exactly (insert-or-ignore); False when it was already applied."""
    return (await conn.exec_driver_sql(st.claim_event.sql, mark.row())).rowcount == 1
