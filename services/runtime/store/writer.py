"""The one writer task: batches queued write requests into one transaction each.

A single-row commit costs a WAL append and, on PostgreSQL, a round trip; batching amortises both.
The writer takes the first queued request, drains whatever else is queued (up to
``max_batch_rows``), optionally lingers a moment for more, writes the whole batch in one
transaction with bulk statements, commits once, and only then resolves every caller's future. A
caller therefore never sees success for a write that is not durable, which is what lets a JetStream
consumer ack right after ``await store.apply_event(...)`` returns.

If the batch fails as a whole (a duplicate key, a stale version, a lease for an unknown job), the
writer rolls it back and replays it request by request inside one transaction, each request under
its own SAVEPOINT: the offending request gets the exception, every other request commits.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.runtime.store.engine import WRITER_OPTIONS, StoreConfig
from services.runtime.store.errors import ConstraintViolationError, StoreClosedError
from services.runtime.store.ops import AppliedMark, Dialect, Step, claim_event, claim_events, run_steps
from services.runtime.store.records import WriterStats

log = logging.getLogger(__name__)

_Outcome = bool | BaseException


class _Request:
    """One caller's atomic unit of work: optional event claim, then steps, resolved by ``future``."""

    __slots__ = ("future", "mark", "rows", "steps")

    def __init__(self, steps: list[Step], mark: AppliedMark | None, future: asyncio.Future[bool]) -> None:
        self.steps = steps
        self.mark = mark
        self.future = future
        self.rows = sum(len(s.rows) for s in steps) + (mark is not None)


def _translate(exc: BaseException) -> BaseException:
    """Database errors a caller can act on become store errors; the driver's message is kept."""
    if isinstance(exc, IntegrityError | DataError):
        err = ConstraintViolationError(
            f"write rejected by the database: {exc.orig}; nothing from this request was written"
        )
        err.__cause__ = exc
        return err
    return exc


class BatchWriter:
    """Owns the write queue and the task that drains it. Created and started by ``Store.open``."""

    def __init__(self, engine: AsyncEngine, dialect: Dialect, config: StoreConfig) -> None:
        self._engine = engine
        self._dialect = dialect
        self._max_rows = config.max_batch_rows
        self._linger_s = config.linger_s
        self._queue: asyncio.Queue[_Request | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._transactions = 0
        self._batches = 0
        self._requests = 0
        self._rows = 0
        self._isolated = 0
        self._failed = 0

    @property
    def stats(self) -> WriterStats:
        return WriterStats(
            transactions=self._transactions,
            batches=self._batches,
            requests=self._requests,
            rows=self._rows,
            isolated_retries=self._isolated,
            failed_requests=self._failed,
        )

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="roundhouse-store-writer")

    def enqueue(self, steps: list[Step], mark: AppliedMark | None) -> asyncio.Future[bool]:
        """Queue one atomic request; the future resolves after its batch commits (True), or to False
        when ``mark`` names an event already applied, or to the request's exception."""
        if self._closing or self._task is None or self._task.done():
            raise StoreClosedError("the store is closed (or its writer stopped); open a new Store to write")
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Request(steps, mark, future))
        return future

    async def close(self) -> None:
        """Commit everything queued so far, then stop the task."""
        if self._closing:
            if self._task is not None:
                await asyncio.shield(self._task)
            return
        self._closing = True
        if self._task is None:
            return
        self._queue.put_nowait(None)
        await asyncio.shield(self._task)

    # --- the task --------------------------------------------------------------------------------
    async def _run(self) -> None:
        batch: list[_Request] = []
        try:
            stopping = False
            while not stopping:
                first = await self._queue.get()
                if first is None:
                    break
                batch = [first]
                stopping, rows = self._drain(batch, first.rows)
                if not stopping and rows < self._max_rows and self._linger_s > 0:
                    await asyncio.sleep(self._linger_s)
                    stopping, rows = self._drain(batch, rows)
                await self._commit(batch)
                batch = []
        finally:
            # Only reached with requests left on a crash or cancellation: fail them loudly.
            self._closing = True
            pending = [r for r in batch if not r.future.done()]
            while not self._queue.empty():
                req = self._queue.get_nowait()
                if req is not None:
                    pending.append(req)
            for req in pending:
                if not req.future.done():
                    req.future.set_exception(
                        StoreClosedError("the store writer stopped before this write committed")
                    )

    def _drain(self, batch: list[_Request], rows: int) -> tuple[bool, int]:
        queue = self._queue
        while rows < self._max_rows:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return False, rows
            if req is None:
                return True, rows
            batch.append(req)
            rows += req.rows
        return False, rows

    async def _commit(self, batch: list[_Request]) -> None:
        self._batches += 1
        outcomes: list[_Outcome]
        try:
            outcomes = list(await self._write_batch(batch))
        except Exception as exc:
            log.debug("batch of %d requests failed (%s); retrying request by request", len(batch), exc)
            self._isolated += 1
            outcomes = await self._write_isolated(batch)
        for req, outcome in zip(batch, outcomes, strict=True):
            self._requests += 1
            if isinstance(outcome, BaseException):
                self._failed += 1
                if not req.future.done():
                    req.future.set_exception(outcome)
            else:
                self._rows += req.rows
                if not req.future.done():
                    req.future.set_result(outcome)

    async def _write_batch(self, batch: list[_Request]) -> list[bool]:
        async with self._engine.connect() as conn:
            await conn.execution_options(**WRITER_OPTIONS)
            async with conn.begin():
                flags = await claim_events(conn, [r.mark for r in batch])
                steps = [s for r, run in zip(batch, flags, strict=True) if run for s in r.steps]
                await run_steps(conn, self._dialect, steps, exact=False)
        self._transactions += 1
        return flags

    async def _write_isolated(self, batch: list[_Request]) -> list[_Outcome]:
        outcomes: list[_Outcome] = []
        try:
            async with self._engine.connect() as conn:
                await conn.execution_options(**WRITER_OPTIONS)
                async with conn.begin():
                    for req in batch:
                        savepoint = await conn.begin_nested()
                        try:
                            run = (
                                True if req.mark is None else await claim_event(conn, self._dialect, req.mark)
                            )
                            if run:
                                await run_steps(conn, self._dialect, req.steps, exact=True)
                        except Exception as exc:
                            await savepoint.rollback()
                            outcomes.append(_translate(exc))
                        else:
                            await savepoint.commit()
                            outcomes.append(run)
            self._transactions += 1
        except Exception as exc:
            # The transaction itself failed (connection lost, commit refused): nothing committed.
            return [_translate(exc) for _ in batch]
        return outcomes
