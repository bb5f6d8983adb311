"""Terms: what a replica starts when it is elected leader, and stops when it is deposed.

On election (:meth:`Leadership.on_elected`) the replica first claims the term in the store
(``Store.claim_term``): the term's epoch is above every epoch claimed before, even when the election's
KV revision started again after NATS lost its data, and from then on every write of this replica is
fenced to that epoch (a write after a newer leader claimed fails in the store, whole). Then it loads
a fresh book from the store and its node
inventory (every node given a fresh ``lease_ttl_s``: nobody knows when it last spoke), requeues
RUNNING jobs found without a lease, opens a :class:`Term` (the epoch, its ``LeaseExecutor`` and
``RoundTimer``), starts the durable consumers of the job and node facts, subscribes to heartbeats,
plans and the fast path of ``job.suspended``, serves ``query.jobs`` and ``query.admission``,
watches the job metrics and runs the round loop and the sweeper. On deposition
(:meth:`Leadership.on_deposed`) it stops all of that before another replica can act, and forgets the
book.

Election and deposition never interleave (one lock): a deposition that finishes late can never
replace the book of a term that began meanwhile. A consumer's handler refuses to run, and refuses to
have its message acked, once its term is over (:func:`_fenced`): the message is left to the next
leader instead of being acked by a replica that woke up deposed (a paused process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nats.aio.subscription import Subscription

from schemas.control import AdmissionQuery, AdmissionReply, JobsQuery, JobsReply
from schemas.jobs import JobSuspended
from schemas.nodes import NodeHeartbeat
from schemas.rounds import PlacementPlan
from schemas.subjects import JOB_SUSPENDED, NODE_HEARTBEAT, PLACEMENT_PLAN, QUERY_ADMISSION, QUERY_JOBS
from services.core.protocols import Trigger
from services.runtime.consumer import ConsumerHandler, ConsumerOptions, DurableConsumer
from services.runtime.kv import KVWatcher
from services.runtime.store import LeaseRecord
from services.scheduler.book import JobBook
from services.scheduler.executor import DeposedError, LeaseExecutor
from services.scheduler.inventory import META_KEY
from services.scheduler.leases import leases_from_records
from services.scheduler.metrics import BUCKET as METRICS_BUCKET
from services.scheduler.metrics import BUCKET_TTL_S as METRICS_TTL_S
from services.scheduler.replica import CONSUMERS, Replica
from services.scheduler.rounds import RoundTimer

if TYPE_CHECKING:
    from services.scheduler.cycle import RoundCycle
    from services.scheduler.execution import Execution
    from services.scheduler.facts import JobFacts
    from services.scheduler.nodes import NodeFacts

log = logging.getLogger("roundhouse.scheduler")


@dataclass(slots=True)
class Term:
    """Everything that lives only while this replica leads one term."""

    epoch: int
    executor: LeaseExecutor
    timer: RoundTimer
    consumers: list[DurableConsumer[Any]] = field(default_factory=list)
    consumer_for: dict[str, DurableConsumer[Any]] = field(default_factory=dict)
    """The term's durable consumer of each subject (facts about unknown jobs ask the arrivals'
    consumer whether their job.arrived can still come)."""
    subscriptions: list[Subscription] = field(default_factory=list)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    pending_plan: tuple[int, int, asyncio.Future[PlacementPlan]] | None = None
    """The round in flight: its number, state version and the future its plan settles."""
    watchers: list[KVWatcher] = field(default_factory=list)
    dispatch: asyncio.Future[None] | None = None
    """The last round's grants being sent (see ``Execution._dispatch_grants``)."""

    def spawn(self, coro: Awaitable[Any], name: str) -> None:
        """Run ``coro`` as one of this term's tasks (cancelled when the term ends)."""
        task = asyncio.ensure_future(coro)
        task.set_name(f"scheduler-{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class Leadership:
    """The election's callbacks: start a term's work on election, stop it on deposition."""

    def __init__(
        self,
        replica: Replica,
        *,
        facts: JobFacts,
        nodes: NodeFacts,
        cycle: RoundCycle,
        execution: Execution,
        on_query: Callable[[JobsQuery], Awaitable[JobsReply]],
        consumer_options: ConsumerOptions,
        on_admission_query: Callable[[AdmissionQuery], Awaitable[AdmissionReply]] | None = None,
    ) -> None:
        self.replica = replica
        self.facts = facts
        self.nodes = nodes
        self.cycle = cycle
        self.execution = execution
        self.on_query = on_query
        self.on_admission_query = on_admission_query
        self.consumer_options = consumer_options
        self._transition = asyncio.Lock()

    async def on_elected(self, revision: int) -> None:
        """Take over with the election's ``revision`` as the candidate epoch (see the module doc)."""
        async with self._transition:
            await self._take_over(revision)

    async def _take_over(self, revision: int) -> None:
        r = self.replica
        assert r.bus is not None
        assert r.store is not None
        bus, store, cfg = r.bus, r.store, r.cfg
        epoch = await store.claim_term(revision)
        if epoch != revision:
            log.warning("election revision %d is not above the store's last term: this term's epoch is %d",
                        revision, epoch)  # fmt: skip
        r.inventory.loads(await store.get_meta(META_KEY), r.clock.monotonic())
        records = await store.active_jobs()
        lease_rows: list[LeaseRecord] = []
        for node_id in sorted({n.node_id for n in r.inventory.live()}):
            lease_rows.extend(await store.leases_for_node(node_id))
        book = JobBook()
        orphans = book.load(records, leases_from_records(lease_rows))
        r.book = book
        last = await store.last_round()
        self.cycle.begin_term(last.round_number if last is not None else 0)
        executor = LeaseExecutor(
            bus, epoch=epoch, is_current=r.is_current,
            request_timeout_s=cfg.request_timeout_s, grant_attempts=cfg.grant_attempts,
            max_parallel=cfg.max_parallel_requests, hostname=r.hostname, clock=r.clock, newer_term=store.term,
        )  # fmt: skip
        timer = RoundTimer(
            cfg.round_s, self.cycle.policy.triggers, cfg.churn_debounce_s, fill=cfg.fill_between_rounds, clock=r.clock
        )
        term = Term(epoch, executor, timer)
        r.term = term
        if orphans:
            log.warning("requeueing %d running jobs without a lease", len(orphans))
            async with r.lock:
                await self.execution.requeue(orphans)
        for subject, (model, handler) in {**self.facts.consumers(), **self.nodes.consumers()}.items():
            consumer = await bus.consume(
                subject, model, _fenced(r, term, handler), durable=CONSUMERS[subject], options=self.consumer_options
            )
            term.consumers.append(consumer)
            term.consumer_for[subject] = consumer
        term.subscriptions.append(await bus.subscribe(NODE_HEARTBEAT, NodeHeartbeat, self.nodes.on_heartbeat))
        term.subscriptions.append(await bus.subscribe(JOB_SUSPENDED, JobSuspended, self.facts.on_suspension_seen))
        term.subscriptions.append(await bus.subscribe(PLACEMENT_PLAN, PlacementPlan, self.cycle.on_plan))
        term.subscriptions.append(await bus.serve(QUERY_JOBS, JobsQuery, self.on_query))
        if self.on_admission_query is not None:
            term.subscriptions.append(await bus.serve(QUERY_ADMISSION, AdmissionQuery, self.on_admission_query))
        metrics = await bus.kv(METRICS_BUCKET, ttl_s=METRICS_TTL_S)
        term.watchers.append(await metrics.watch(">", self.facts.on_metrics))
        term.spawn(self.cycle.round_loop(term), "rounds")
        term.spawn(self.nodes.sweep_loop(term), "sweep")
        if not self.cycle.policy.triggers & Trigger.TIMER:
            # A round at once; a timed policy's first tick is now anyway (``RoundTimer``), and a
            # manual kick beside it made two back-to-back rounds at every term's start.
            term.timer.soon()
        log.info("leading", extra={"epoch": epoch, "jobs": len(r.book.jobs), "nodes": len(r.inventory)})

    async def on_deposed(self, epoch: int) -> None:
        async with self._transition:
            await self._stop_term()

    async def _stop_term(self) -> None:
        r = self.replica
        term, r.term = r.term, None
        if term is None:
            return
        current = asyncio.current_task()
        for task in list(term.tasks):
            if task is not current:
                task.cancel()
        for sub in term.subscriptions:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for consumer in term.consumers:
            await consumer.stop()
        for watcher in term.watchers:
            await watcher.stop()
        if term.pending_plan is not None and not term.pending_plan[2].done():
            term.pending_plan[2].cancel()
        if r.term is None:  # (always, under the lock; kept as the rule: never wipe a newer term's book)
            r.book = JobBook()


def _fenced(replica: Replica, term: Term, handler: ConsumerHandler[Any]) -> ConsumerHandler[Any]:
    """``handler`` for one term's consumer: it runs only while the term is current, and its message
    is acked only if the term still was when it finished (else the consumer naks it for the next
    leader). Writes are fenced in the store besides; this covers what a handler keeps in memory."""

    def current() -> bool:
        return replica.term is term and replica.is_current(term.epoch)

    async def run(event: Any) -> Any:
        if not current():
            raise DeposedError(f"term {term.epoch} is over; left for the next leader")
        result = await handler(event)
        if result is None and not current():
            raise DeposedError(f"term {term.epoch} ended while handling this; left for the next leader")
        return result

    return run
