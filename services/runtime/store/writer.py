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
from collections import deque

from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.runtime.store.engine import WRITER_OPTIONS, StoreConfig
from services.runtime.store.errors import ConstraintViolationError, StoreClosedError
from services.runtime.store.ops import (
    AppliedMark,
    ClaimConflictError,
    Statements,
    Step,
    claim_event,
    claim_events,
    run_steps,
)
from services.runtime.store.records import WriterStats
from services.runtime.store.term import FencedOutError, check_fence

log = logging.getLogger(__name__)

_Outcome = bool | BaseException


class _Request:
    """One caller's atomic unit of work: optional event claim, then steps, resolved by ``future``."""

    __slots__ = ("future", "mark", "rows", "steps")

    def __init__(self, steps: list[Step], mark: AppliedMark | None, future: asyncio.Future[bool]) -> None:
        self.steps = steps
        self.mark = mark
        self.future = future
        rows = len(steps[0].rows) if len(steps) == 1 else sum(len(s.rows) for s in steps)
        self.rows = rows + 1 if mark is not None else rows


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

    def __init__(self, engine: AsyncEngine, statements: Statements, config: StoreConfig) -> None:
        self._engine = engine
        self._st = statements
        self._max_rows = config.max_batch_rows
        self._linger_s = config.linger_s
        # A deque and a wake-up future rather than an asyncio.Queue: enqueue is on every caller's
        # path and the writer takes hundreds of requests at a time.
        self._pending: deque[_Request] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.fence: int | None = None
        """The leader epoch every transaction must still hold (``term.py``); None: unfenced."""
        self._transactions = 0
        self._batches = 0
        self._requests = 0
        self._rows = 0
        self._isolated = 0
        self._claim_retries = 0
        self._failed = 0

    @property
    def stats(self) -> WriterStats:
        return WriterStats(
            transactions=self._transactions,
            batches=self._batches,
            requests=self._requests,
            rows=self._rows,
            isolated_retries=self._isolated,
            claim_retries=self._claim_retries,
            failed_requests=self._failed,
        )

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken into a batch."""
        return len(self._pending)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="roundhouse-store-writer")

    def enqueue(self, steps: list[Step], mark: AppliedMark | None) -> asyncio.Future[bool]:
        """Queue one atomic request; the future resolves after its batch commits (True), or to False
        when ``mark`` names an event already applied, or to the request's exception."""
        task = self._task
        if self._closing or task is None or task.done():
            raise StoreClosedError("the store is closed (or its writer stopped); open a new Store to write")
        future: asyncio.Future[bool] = task.get_loop().create_future()
        self._pending.append(_Request(steps, mark, future))
        self._wake()
        return future

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def close(self) -> None:
        """Commit everything queued so far, then stop the task."""
        self._closing = True
        if self._task is None:
            return
        self._wake()
        await asyncio.shield(self._task)

    # --- the task --------------------------------------------------------------------------------
    async def _run(self) -> None:
        pending = self._pending
        loop = asyncio.get_running_loop()
        batch: list[_Request] = []
        try:
            while True:
                if not pending:
                    if self._closing:
                        return
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    self._wakeup = None
                    # Woken from idle: give concurrent callers a moment to join this batch. Under
                    # load the queue is never empty after a commit, and batches form without waiting.
                    if self._linger_s > 0 and not self._closing:
                        await asyncio.sleep(self._linger_s)
                    continue
                batch = []
                rows = 0
                while pending and rows < self._max_rows:
                    req = pending.popleft()
                    batch.append(req)
                    rows += req.rows
                await self._commit(batch)
                batch = []
        finally:
            # Reached with requests left only on a crash or cancellation: fail them loudly.
            self._closing = True
            batch.extend(pending)
            pending.clear()
            for req in batch:
                if not req.future.done():
                    req.future.set_exception(
                        StoreClosedError("the store writer stopped; this write may not have committed")
                    )

    async def _commit(self, batch: list[_Request]) -> None:
        self._batches += 1
        self._requests += len(batch)
        outcomes: list[_Outcome]
        try:
            try:
                flags = await self._write_batch(batch, preselect=False)
            except ClaimConflictError:
                # A redelivered event in the batch: look the batch's events up first this time.
                self._claim_retries += 1
                flags = await self._write_batch(batch, preselect=True)
        except FencedOutError as exc:
            outcomes = [exc for _ in batch]  # no request of a fenced-out term may commit
        except Exception as exc:
            log.debug("batch of %d requests failed (%s); retrying request by request", len(batch), exc)
            self._isolated += 1
            outcomes = await self._write_isolated(batch)
        else:
            for req, flag in zip(batch, flags, strict=True):
                self._rows += req.rows
                if not req.future.done():
                    req.future.set_result(flag)
            return
        for req, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                self._failed += 1
                if not req.future.done():
                    req.future.set_exception(outcome)
            else:
                self._rows += req.rows
                if not req.future.done():
                    req.future.set_result(outcome)

    async def _write_batch(self, batch: list[_Request], *, preselect: bool) -> list[bool]:
        async with self._engine.connect() as conn:
            await conn.execution_options(**WRITER_OPTIONS)
            async with conn.begin():
                if self.fence is not None:
                    await check_fence(conn, self.fence)
                if any(r.mark is not None for r in batch):
                    flags = await claim_events(conn, self._st, [r.mark for r in batch], preselect=preselect)
                    steps = [s for r, run in zip(batch, flags, strict=True) if run for s in r.steps]
                else:
                    flags = [True] * len(batch)
                    steps = [s for r in batch for s in r.steps]
                await run_steps(conn, self._st, steps, exact=False)
        self._transactions += 1
        return flags

    async def _write_isolated(self, batch: list[_Request]) -> list[_Outcome]:
        outcomes: list[_Outcome] = []
        try:
            async with self._engine.connect() as conn:
                await conn.execution_options(**WRITER_OPTIONS)
                async with conn.begin():
                    if self.fence is not None:
                        await check_fence(conn, self.fence)
                    for req in batch:
                        savepoint = await conn.begin_nested()
                        try:
                            run = True if req.mark is None else await claim_event(conn, self._st, req.mark)
                            if run:
                                await run_steps(conn, self._st, req.steps, exact=True)
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
