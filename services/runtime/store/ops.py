"""Write operations: what callers submit, and how the writer turns a run of them into bulk statements.

A caller hands the store a list of operations (public frozen dataclasses below). They are compiled
right away into ``Step``s, pre-encoded rows plus the bulk statement that writes them, so that a bad
argument fails in the caller and never enters a batch. The writer concatenates the steps of every
request in a batch and merges *consecutive* steps of the same shape into one ``executemany``: order
is preserved, so a job inserted before a lease that references it is still inserted first.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, assert_never

from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert, Update

from services.runtime.store.codec import RowDict, changes_to_row, job_to_row, lease_to_row, round_to_row
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


WriteOp: TypeAlias = (
    InsertJobs | UpdateJob | UpsertLeases | DeleteLeases | RecordRound | SetMeta | PruneAppliedEvents
)


@dataclass(frozen=True, slots=True)
class AppliedMark:
    """The applied-events row an ``apply_event`` request claims before its operations run."""

    consumer: str
    event_id: str
    applied_at: float

    def row(self) -> RowDict:
        return {"consumer": self.consumer, "event_id": self.event_id, "applied_at": self.applied_at}


# --- dialect-specific statements ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dialect:
    """What the writer needs to know about the backend, resolved once per engine."""

    name: str
    sane_multi_rowcount: bool
    """True when an ``executemany`` reports the total rows it changed (SQLite; not asyncpg)."""
    upsert_leases: Insert
    upsert_meta: Insert
    claim_event: Insert
    """INSERT ... ON CONFLICT DO NOTHING into applied_events: rowcount 0 means already applied."""

    @classmethod
    def for_backend(cls, name: str, sane_multi_rowcount: bool) -> Dialect:
        if name == "sqlite":
            make: Callable[..., sqlite.Insert | postgresql.Insert] = sqlite.insert
        elif name == "postgresql":
            make = postgresql.insert
        else:
            raise StoreError(f"no upsert support for backend {name!r}; use SQLite or PostgreSQL")
        leases = make(leases_table)
        upsert_leases = leases.on_conflict_do_update(
            index_elements=["lease_id"],
            set_={c.name: leases.excluded[c.name] for c in leases_table.c if c.name != "lease_id"},
        )
        meta = make(meta_table)
        upsert_meta = meta.on_conflict_do_update(index_elements=["key"], set_={"value": meta.excluded.value})
        claim = make(applied_table).on_conflict_do_nothing(index_elements=["consumer", "event_id"])
        return cls(name, sane_multi_rowcount, upsert_leases, upsert_meta, claim)


# --- compiled steps ------------------------------------------------------------------------------

Runner: TypeAlias = Callable[[AsyncConnection, Dialect, list[RowDict], bool], Awaitable[None]]
"""Writes a run of rows: (connection, dialect, rows, exact). ``exact`` asks for per-row error reports."""


@dataclass(slots=True)
class Step:
    """Pre-encoded rows and the runner that writes them; steps with equal ``group`` may be merged."""

    run: Runner
    group: Hashable | None
    rows: list[RowDict]


class AmbiguousConflictError(StoreError):
    """A bulk update changed fewer rows than it named; the writer retries request by request to
    find the one at fault. Never reaches a caller."""


_insert_jobs = insert(jobs_table)
_insert_rounds = insert(rounds_table)
_insert_applied = insert(applied_table)
_update_cache: dict[tuple[tuple[str, ...], bool], Update] = {}


def _update_statement(columns: tuple[str, ...], checked: bool) -> Update:
    key = (columns, checked)
    stmt = _update_cache.get(key)
    if stmt is None:
        stmt = update(jobs_table).where(jobs_table.c.job_id == bindparam("b_job_id"))
        if checked:
            stmt = stmt.where(jobs_table.c.version == bindparam("b_version"))
        stmt = stmt.values({"version": jobs_table.c.version + 1, **{c: bindparam(c) for c in columns}})
        _update_cache[key] = stmt
    return stmt


async def _run_insert_jobs(conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool) -> None:
    await conn.execute(_insert_jobs, rows)


async def _run_insert_rounds(
    conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool
) -> None:
    await conn.execute(_insert_rounds, rows)


async def _diagnose_update(conn: AsyncConnection, row: RowDict) -> None:
    job_id = str(row["b_job_id"])
    actual = (
        await conn.execute(select(jobs_table.c.version).where(jobs_table.c.job_id == job_id))
    ).scalar_one_or_none()
    if actual is None:
        raise JobNotFoundError(job_id)
    expected = row.get("b_version")
    raise StaleWriteError(job_id, int(expected) if expected is not None else -1, int(actual))


async def _run_update_jobs(conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool) -> None:
    first = rows[0]
    columns = tuple(sorted(k for k in first if not k.startswith("b_")))
    stmt = _update_statement(columns, "b_version" in first)
    if exact or len(rows) == 1 or not dialect.sane_multi_rowcount:
        for row in rows:
            if (await conn.execute(stmt, row)).rowcount != 1:
                await _diagnose_update(conn, row)
        return
    result = await conn.execute(stmt, rows)
    if result.rowcount != len(rows):
        raise AmbiguousConflictError(f"bulk update changed {result.rowcount} of {len(rows)} jobs")


def _unique_runs(rows: list[RowDict], key: str) -> list[list[RowDict]]:
    """Split rows so no key repeats within a run: PostgreSQL refuses a multi-row upsert that would
    touch one row twice ("ON CONFLICT DO UPDATE command cannot affect row a second time")."""
    runs: list[list[RowDict]] = [[]]
    seen: set[object] = set()
    for row in rows:
        k = row[key]
        if k in seen:
            runs.append([])
            seen = set()
        seen.add(k)
        runs[-1].append(row)
    return runs


async def _run_upsert_leases(
    conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool
) -> None:
    for run in _unique_runs(rows, "lease_id"):
        await conn.execute(dialect.upsert_leases, run)


async def _run_set_meta(conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool) -> None:
    for run in _unique_runs(rows, "key"):
        await conn.execute(dialect.upsert_meta, run)


async def _run_delete_leases(
    conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool
) -> None:
    ids = [str(r["lease_id"]) for r in rows]
    for i in range(0, len(ids), _IN_CHUNK):
        await conn.execute(delete(leases_table).where(leases_table.c.lease_id.in_(ids[i : i + _IN_CHUNK])))


async def _run_prune(conn: AsyncConnection, dialect: Dialect, rows: list[RowDict], exact: bool) -> None:
    for row in rows:
        stmt = delete(applied_table).where(applied_table.c.applied_at < row["older_than"])
        if row["consumer"] is not None:
            stmt = stmt.where(applied_table.c.consumer == row["consumer"])
        await conn.execute(stmt)


def compile_op(op: WriteOp) -> Step | None:
    """Encode one operation (validating it); None when it writes nothing (an empty list)."""
    match op:
        case InsertJobs(jobs):
            return Step(_run_insert_jobs, "insert_jobs", [job_to_row(j) for j in jobs]) if jobs else None
        case UpdateJob(job_id, changes, expected_version):
            row = changes_to_row(job_id, changes)
            row["b_job_id"] = job_id
            if expected_version is not None:
                row["b_version"] = expected_version
            return Step(_run_update_jobs, ("update_job", frozenset(row)), [row])
        case UpsertLeases(leases):
            return (
                Step(_run_upsert_leases, "upsert_leases", [lease_to_row(x) for x in leases])
                if leases
                else None
            )
        case DeleteLeases(lease_ids):
            rows: list[RowDict] = [{"lease_id": i} for i in lease_ids]
            return Step(_run_delete_leases, "delete_leases", rows) if rows else None
        case RecordRound(rnd):
            return Step(_run_insert_rounds, "insert_rounds", [round_to_row(rnd)])
        case SetMeta(key, value):
            return Step(_run_set_meta, "set_meta", [{"key": key, "value": value}])
        case PruneAppliedEvents(older_than, consumer):
            return Step(_run_prune, None, [{"older_than": older_than, "consumer": consumer}])
        case _:
            assert_never(op)


def compile_ops(ops: Iterable[WriteOp]) -> list[Step]:
    steps: list[Step] = []
    for op in ops:
        step = compile_op(op)
        if step is not None:
            steps.append(step)
    return steps


async def run_steps(conn: AsyncConnection, dialect: Dialect, steps: Sequence[Step], *, exact: bool) -> None:
    """Execute steps in order, merging consecutive steps of one group into one bulk statement."""
    i = 0
    while i < len(steps):
        step = steps[i]
        rows = step.rows
        j = i + 1
        if step.group is not None:
            while j < len(steps) and steps[j].group == step.group:
                if rows is step.rows:
                    rows = list(rows)
                rows.extend(steps[j].rows)
                j += 1
        await step.run(conn, dialect, rows, exact)
        i = j


async def claim_events(conn: AsyncConnection, marks: Sequence[AppliedMark | None]) -> list[bool]:
    """Claim the events of a batch at once: one SELECT per consumer for ids already applied, one bulk
    INSERT for the rest. Returns, per request, whether its operations should run (False: a no-op
    redelivery, or a duplicate of an earlier request in the same batch). A concurrent writer in
    another process that claims an id in between makes the INSERT fail; the writer then falls back
    to ``claim_event`` per request, which is exact."""
    flags = [True] * len(marks)
    by_consumer: dict[str, list[str]] = {}
    for mark in marks:
        if mark is not None:
            by_consumer.setdefault(mark.consumer, []).append(mark.event_id)
    if not by_consumer:
        return flags
    applied: set[tuple[str, str]] = set()
    for consumer, ids in by_consumer.items():
        for i in range(0, len(ids), _IN_CHUNK):
            stmt = select(applied_table.c.event_id).where(
                applied_table.c.consumer == consumer, applied_table.c.event_id.in_(ids[i : i + _IN_CHUNK])
            )
            applied.update((consumer, event_id) for event_id in (await conn.execute(stmt)).scalars())
    new_rows: list[RowDict] = []
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
        await conn.execute(_insert_applied, new_rows)
    return flags


async def claim_event(conn: AsyncConnection, dialect: Dialect, mark: AppliedMark) -> bool:
    """Claim one event exactly (insert-or-ignore); False when it was already applied."""
    return (await conn.execute(dialect.claim_event, mark.row())).rowcount == 1
