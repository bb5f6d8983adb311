"""What the parts of one scheduler replica share, and the one path by which the book changes.

A :class:`Replica` holds the settings and the clock, the book (``book.py``) and the store it is
written through, the node inventory, the leader election and the term this replica leads, if any
(``term.py``). The parts (``facts.py``, ``nodes.py``, ``execution.py``, ``cycle.py``) each hold the
replica and read ``replica.book`` and ``replica.term`` when they act: both are replaced with every
term.

Every change of the book is a ``Change`` committed with :meth:`Replica.commit` (or queued with
:meth:`Replica.commit_later`) under :attr:`Replica.lock`: one lock serializes the transitions, so
each is computed on the state the previous one left, and the in-memory effect is applied only once
the store has it. A write the store refuses as stale (a newer leader wrote first) steps down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from schemas.rounds import RoundTrigger
from schemas.subjects import (
    JOB_ACCEPTED,
    JOB_ARRIVED,
    JOB_CANCEL,
    JOB_CHECKPOINTED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_HELD,
    JOB_REJECTED,
    JOB_STARTED,
    JOB_SUSPENDED,
    NODE_REGISTER,
)
from services.runtime.bus import Bus
from services.runtime.clock import Clock
from services.runtime.store import ConstraintViolationError, StaleWriteError, Store
from services.scheduler.book import Change, JobBook
from services.scheduler.config import SchedulerConfig
from services.scheduler.inventory import Inventory
from services.scheduler.leader import LeaderElection
from services.scheduler.trust import RefusalLog

if TYPE_CHECKING:
    from services.scheduler.term import Term

log = logging.getLogger("roundhouse.scheduler")

CONSUMERS: dict[str, str] = {
    JOB_ARRIVED: "scheduler-arrived",
    JOB_ACCEPTED: "scheduler-accepted",
    JOB_HELD: "scheduler-held",
    JOB_REJECTED: "scheduler-rejected",
    JOB_CANCEL: "scheduler-cancel",
    JOB_STARTED: "scheduler-started",
    JOB_CHECKPOINTED: "scheduler-checkpointed",
    JOB_SUSPENDED: "scheduler-suspended",
    JOB_COMPLETED: "scheduler-completed",
    JOB_FAILED: "scheduler-failed",
    NODE_REGISTER: "scheduler-nodes",
}
"""Durable consumer name per subject (per namespace)."""


class Replica:
    """One scheduler replica's shared state: see the module doc."""

    def __init__(self, cfg: SchedulerConfig, clock: Clock) -> None:
        self.cfg = cfg
        self.clock = clock
        self.book = JobBook()
        self.inventory = Inventory(cfg.lease_ttl_s, silent_s=cfg.silent_after_s)
        self.store: Store | None = None
        self.bus: Bus | None = None
        self.election: LeaderElection | None = None
        self.term: Term | None = None
        """The term this replica leads; None while it follows."""
        self.lock = asyncio.Lock()
        self.refusals = RefusalLog(clock.monotonic, logger=log)
        """Messages refused for their source or their sender's rights (``trust.py``), by reason."""
        self.on_landed: Callable[[Change], None] | None = None
        """Called with each change once the store has it, before its in-memory effect (so the jobs
        still show their previous values): the Prometheus counters (``monitoring.py``)."""

    # --- leadership -------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.term is not None and self.election is not None and self.election.is_leader

    def is_current(self, epoch: int) -> bool:
        """Whether ``epoch`` is the term this replica leads now (the executor's fence)."""
        return self.term is not None and self.term.epoch == epoch and self.is_leader

    async def step_down(self, why: BaseException) -> None:
        log.warning("stepping down: %s", why)
        if self.election is not None:
            await self.election.resign()

    def churn(self, reason: RoundTrigger) -> None:
        """Something changed that may start a round (the term's ``RoundTimer`` decides)."""
        if self.term is not None:
            self.term.timer.churn(reason)

    def hostname(self, node_id: str) -> str:
        node = self.inventory.get(node_id)
        return node.hostname if node is not None else node_id

    # --- committing -------------------------------------------------------------------------
    def _consumer(self, consumer: str) -> str:
        return self.bus.name(consumer) if self.bus else consumer

    async def commit(self, change: Change | None, *, event_id: object = None, consumer: str = "") -> bool:
        """Write ``change`` (as an applied event when ``event_id`` is given), then apply it in memory.
        Call with ``lock`` held."""
        assert self.store is not None
        if change is None:
            return False
        try:
            if event_id is not None:
                applied = await self.store.apply_event(str(event_id), self._consumer(consumer), change.ops)
                if not applied:
                    return False
            elif change.ops:
                await self.store.submit(change.ops)
        except StaleWriteError as exc:
            self._stale(exc)
            raise
        self._landed(change)
        return True

    def _landed(self, change: Change) -> None:
        """A change is in the store: apply it in memory and hand released leases to the executor."""
        if self.on_landed is not None:
            self.on_landed(change)
        change.commit()
        if change.released and self.term is not None:
            self.term.executor.released(change.released)

    def _stale(self, exc: StaleWriteError) -> None:
        """A newer leader wrote first: this one steps down."""
        if self.term is not None:
            self.term.spawn(self.step_down(exc), "step-down")

    def commit_later(
        self,
        change: Change | None,
        *,
        event_id: object,
        consumer: str,
        on_conflict: Callable[[], None] | None = None,
        after: Callable[[], None] | None = None,
    ) -> asyncio.Future[None] | None:
        """Queue ``change`` as an applied event now and return its commit, to be awaited later.

        The consumer runs the next handlers before awaiting it, so a fetched batch of independent
        events (arrivals, acceptances of different jobs) shares one store transaction. The in-memory
        effect is applied the moment the store commits (a done-callback, in commit order), not when
        the consumer gets round to awaiting, so other handlers see it as early as possible. Call with
        ``lock`` held.
        """
        assert self.store is not None
        if change is None:
            return None
        future = self.store.apply_event_nowait(str(event_id), self._consumer(consumer), change.ops)
        # The commit the consumer awaits is a plain future settled by the store's done-callback, not a
        # coroutine wrapped in a task: this runs once per arrival and acceptance, and a task per
        # message (its creation, scheduling and registration) cost more than the callback's work.
        settled: asyncio.Future[None] = future.get_loop().create_future()

        def landed(done: asyncio.Future[bool]) -> None:
            if done.cancelled():
                settled.cancel()
                return
            exc = done.exception()
            if exc is None:
                if done.result():
                    self._landed(change)
                if after is not None:
                    after()
                settled.set_result(None)
            elif isinstance(exc, ConstraintViolationError) and on_conflict is not None:
                on_conflict()
                settled.set_result(None)
            else:
                if isinstance(exc, StaleWriteError):
                    self._stale(exc)
                settled.set_exception(exc)

        future.add_done_callback(landed)
        return settled
