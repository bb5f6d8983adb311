"""The scheduler service: owns jobs and leases, runs rounds, executes plans, leads one term at a time.

Every replica campaigns for the leader key (``leader.py``); only the leader does anything else. On
election it loads its book from the store (``book.py``) and its node inventory, starts the durable
consumers of the job and node facts, subscribes to heartbeats and plans, serves ``query.jobs`` and
runs rounds (``rounds.py``). On deposition it stops all of that before another replica can act.

A round (docs/control-plane.md, "A round"): snapshot -> rank with the scheduling policy -> publish
``ScheduleRound`` -> wait for placement's ``PlacementPlan`` -> keep its valid parts -> execute:
revokes first, wait for ``job.suspended`` or the grace deadline, then grants (``executor.py``).

Handlers commit their effect with ``Store.apply_event`` (idempotent by event id) before the
consumer acks; one lock serializes the book's transitions so each is computed on the state the
previous one left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.aio.subscription import Subscription

from schemas.control import JobsQuery, JobsReply
from schemas.jobs import (
    JobAccepted,
    JobArrived,
    JobCancel,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobStarted,
    JobSuspended,
    SuspendReason,
)
from schemas.leases import LeaseAckError, RevokeReason
from schemas.nodes import NodeHeartbeat, NodeRegister
from schemas.rounds import PlacementPlan, RoundTrigger, ScheduleRound
from schemas.subjects import (
    ANY_PLACEMENT,
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
    NODE_HEARTBEAT,
    NODE_REGISTER,
    PLACEMENT_PLAN,
    QUERY_JOBS,
    schedule_round,
)
from services.core.decisions import Plan, Ranking
from services.core.protocols import SchedulingPolicy
from services.core.registry import SCHEDULING
from services.core.round import rank_step
from services.core.snapshot import SnapshotWriter
from services.core.state import UNAVAILABLE, ClusterState, JobState, JobStatus
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.consumer import ConsumerHandler, ConsumerOptions, DurableConsumer
from services.runtime.kv import KVEntry, KVWatcher
from services.runtime.service import RoundhouseService
from services.runtime.store import (
    ConstraintViolationError,
    JobRecord,
    LeaseRecord,
    LeaseState,
    RecordRound,
    RoundRecord,
    SetMeta,
    StaleWriteError,
    Store,
    WriteOp,
)
from services.scheduler.book import Change, JobBook, JobNotArrivedError
from services.scheduler.config import SchedulerConfig
from services.scheduler.executor import DeposedError, GrantRefusedError, LeaseExecutor
from services.scheduler.inventory import META_KEY, Inventory
from services.scheduler.leader import LeaderElection
from services.scheduler.leases import Lease, leases_from_records, new_lease_id
from services.scheduler.metrics import BUCKET as METRICS_BUCKET
from services.scheduler.metrics import BUCKET_TTL_S as METRICS_TTL_S
from services.scheduler.metrics import apply_metrics
from services.scheduler.queries import WaitingContext, answer
from services.scheduler.rounds import RoundTimer, ValidPlan, validate_plan
from services.scheduler.topology import Topology, UnknownGpuError

log = logging.getLogger("roundhouse.scheduler")


@dataclass(slots=True)
class RoundSnapshot:
    """What one round ranked: kept so an in-process placement (tests, benchmarks) can place it."""

    round: int
    epoch: int
    state_version: int
    now: float
    ranking: Ranking
    jobs: dict[str, JobState]
    cluster: ClusterState
    topology: Topology


@dataclass(slots=True)
class RoundTimings:
    """Seconds spent in each phase of the last round (the benchmark prints these)."""

    round: int = 0
    snapshot: float = 0.0
    rank: float = 0.0
    encode: float = 0.0
    """Building the round's snapshot message (a delta against what placement holds)."""
    publish: float = 0.0
    placement: float = 0.0
    apply: float = 0.0
    revoke: float = 0.0
    """Part of ``apply``: marking leases revoking and sending the revokes."""
    wait: float = 0.0
    """Part of ``apply``: waiting for ``job.suspended`` (or the deadlines)."""
    grant: float = 0.0
    """Part of ``apply``: recording the new leases (their grants are sent after the round)."""
    cpu: float = 0.0
    """CPU seconds this process spent during the round (steadier than wall time on a busy host)."""
    grants_acked: float = 0.0
    """After the round: from the start of sending its grants until every one was answered."""
    launched: int = 0
    suspended: int = 0
    dropped: int = 0

    def as_dict(self) -> dict[str, float]:
        names = ("round", "snapshot", "rank", "encode", "publish", "placement", "apply", "revoke", "wait", "grant",
                 "cpu", "grants_acked", "launched", "suspended", "dropped")  # fmt: skip
        return {k: getattr(self, k) for k in names}


@dataclass(slots=True)
class _Term:
    """Everything that lives only while this replica leads one term."""

    epoch: int
    executor: LeaseExecutor
    timer: RoundTimer
    consumers: list[DurableConsumer[Any]] = field(default_factory=list)
    subscriptions: list[Subscription] = field(default_factory=list)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    pending_plan: tuple[int, int, asyncio.Future[PlacementPlan]] | None = None
    watchers: list[KVWatcher] = field(default_factory=list)
    dispatch: asyncio.Future[None] | None = None
    """The last round's grants being sent (see ``SchedulerService._dispatch_grants``)."""


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


class SchedulerService(RoundhouseService):
    """One scheduler replica (``roundhouse service scheduler``)."""

    kind = "scheduler"
    description = "Roundhouse scheduler: jobs, leases, rounds; one leader among replicas"
    config_model = SchedulerConfig

    def __init__(self, config: ServiceConfig, *, consumer_options: ConsumerOptions | None = None) -> None:
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.model_validate(config.model_dump())
        super().__init__(config)
        self.cfg: SchedulerConfig = config
        self.policy: SchedulingPolicy = SCHEDULING.create(config.policy, **config.policy_options)
        self.consumer_options = consumer_options or ConsumerOptions(fetch_timeout_s=0.25)
        self.book = JobBook()
        self.inventory = Inventory(config.lease_ttl_s)
        self.store: Store | None = None
        self.bus: Bus | None = None
        self.election: LeaderElection | None = None
        self.timings = RoundTimings()
        self.snapshot: RoundSnapshot | None = None
        self._last_ranked: tuple[int | None, list[str]] = (None, [])
        """The last round's number and ranked job ids (``roundhouse jobs`` says where queued jobs stand)."""
        self.rounds_run = 0
        self.plans_stale = 0
        self.plans_timed_out = 0
        self.plans_resynced = 0
        self._snapshots = SnapshotWriter()
        """What the placement instance we talk to holds (rounds carry their snapshot, as deltas)."""
        self._lock = asyncio.Lock()
        self._arriving: dict[str, asyncio.Future[None]] = {}
        """job.arrived commits queued but not landed yet, by job id."""
        self._missing_since: dict[str, float] = {}
        """Leases a node's heartbeats stopped listing, with the first such heartbeat's time."""
        self._term: _Term | None = None
        self._round_no = 0
        self._topology: Topology | None = None
        self._cluster: ClusterState | None = None
        self._cluster_topology: Topology | None = None
        self._assigned: dict[str, tuple[int, ...]] = {}
        self._round_listeners: list[Callable[[ValidPlan], Awaitable[None] | None]] = []

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        self.bus = bus
        self.store = await Store.open(self.cfg.db)
        self.election = LeaderElection(
            bus, self.instance, ttl_s=self.cfg.leader_ttl_s,
            on_elected=self._on_elected, on_deposed=self._on_deposed,
        )  # fmt: skip
        await self.election.start()

    async def stop(self) -> None:
        if self.election is not None:
            await self.election.stop(resign=True)
            self.election = None
        if self.store is not None:
            await self.store.close()
            self.store = None

    @property
    def epoch(self) -> int | None:
        """The epoch of the term this replica leads, or None."""
        return self._term.epoch if self._term is not None else None

    @property
    def is_leader(self) -> bool:
        return self._term is not None and self.election is not None and self.election.is_leader

    def stats(self) -> dict[str, Any]:
        return {
            "leader": self.is_leader,
            "epoch": self.epoch,
            "policy": self.policy.name,
            "rounds": self.rounds_run,
            "jobs": len(self.book.jobs),
            "leases": len(self.book.leases),
            "nodes": len(self.inventory),
            "plans_stale": self.plans_stale,
            "plans_timed_out": self.plans_timed_out,
            "plans_resynced": self.plans_resynced,
            "placement_peer": self._snapshots.peer,
            "last_round": self.timings.as_dict(),
        }

    def _is_current(self, epoch: int) -> bool:
        return self._term is not None and self._term.epoch == epoch and self.is_leader

    # --- terms ------------------------------------------------------------------------------
    async def _on_elected(self, epoch: int) -> None:
        assert self.bus is not None
        assert self.store is not None
        bus, store = self.bus, self.store
        now_mono = time.monotonic()
        self.inventory.loads(await store.get_meta(META_KEY), now_mono)
        records = await store.active_jobs()
        lease_rows: list[LeaseRecord] = []
        for node_id in sorted({n.node_id for n in self.inventory.live()}):
            lease_rows.extend(await store.leases_for_node(node_id))
        orphans = self.book.load(records, leases_from_records(lease_rows))
        last = await store.last_round()
        self._round_no = last.round_number if last is not None else 0
        self._topology = None
        self._cluster = None
        self._snapshots.forget()
        executor = LeaseExecutor(
            bus, epoch=epoch, is_current=self._is_current,
            request_timeout_s=self.cfg.request_timeout_s, grant_attempts=self.cfg.grant_attempts,
            max_parallel=self.cfg.max_parallel_requests, hostname=self._hostname,
        )  # fmt: skip
        timer = RoundTimer(
            self.cfg.round_s, self.policy.triggers, self.cfg.churn_debounce_s, fill=self.cfg.fill_between_rounds
        )
        term = _Term(epoch, executor, timer)
        self._term = term
        if orphans:
            log.warning("requeueing %d running jobs without a lease", len(orphans))
            async with self._lock:
                await self._requeue_orphans(orphans)
        handlers: dict[str, tuple[type[Any], ConsumerHandler[Any]]] = {
            JOB_ARRIVED: (JobArrived, self._on_arrived),
            JOB_ACCEPTED: (JobAccepted, self._on_accepted),
            JOB_HELD: (JobHeld, self._on_held),
            JOB_REJECTED: (JobRejected, self._on_rejected),
            JOB_CANCEL: (JobCancel, self._on_cancel),
            JOB_STARTED: (JobStarted, self._on_started),
            JOB_CHECKPOINTED: (JobCheckpointed, self._on_checkpointed),
            JOB_SUSPENDED: (JobSuspended, self._on_suspended),
            JOB_COMPLETED: (JobCompleted, self._on_completed),
            JOB_FAILED: (JobFailed, self._on_failed),
            NODE_REGISTER: (NodeRegister, self._on_register),
        }
        for subject, (model, handler) in handlers.items():
            term.consumers.append(
                await bus.consume(subject, model, handler, durable=CONSUMERS[subject], options=self.consumer_options)
            )
        term.subscriptions.append(await bus.subscribe(NODE_HEARTBEAT, NodeHeartbeat, self._on_heartbeat))
        term.subscriptions.append(await bus.subscribe(JOB_SUSPENDED, JobSuspended, self._on_suspension_seen))
        term.subscriptions.append(await bus.subscribe(PLACEMENT_PLAN, PlacementPlan, self._on_plan))
        term.subscriptions.append(await bus.serve(QUERY_JOBS, JobsQuery, self._on_query))
        metrics = await bus.kv(METRICS_BUCKET, ttl_s=METRICS_TTL_S)
        term.watchers.append(await metrics.watch(">", self._on_metrics))
        self._spawn(term, self._round_loop(term), "rounds")
        self._spawn(term, self._sweep_loop(term), "sweep")
        term.timer.soon()
        log.info("leading", extra={"epoch": epoch, "jobs": len(self.book.jobs), "nodes": len(self.inventory)})

    async def _on_deposed(self, epoch: int) -> None:
        term, self._term = self._term, None
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
        self.book = JobBook()

    def _spawn(self, term: _Term, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"scheduler-{name}")
        term.tasks.add(task)
        task.add_done_callback(term.tasks.discard)

    async def _step_down(self, why: BaseException) -> None:
        log.warning("stepping down: %s", why)
        if self.election is not None:
            await self.election.resign()

    def _hostname(self, node_id: str) -> str:
        node = self.inventory.get(node_id)
        return node.hostname if node is not None else node_id

    # --- committing -------------------------------------------------------------------------
    async def _commit(self, change: Change | None, *, event_id: object = None, consumer: str = "") -> bool:
        """Write ``change`` (as an applied event when ``event_id`` is given), then apply it in memory.
        Call with ``self._lock`` held."""
        assert self.store is not None
        if change is None:
            return False
        try:
            if event_id is not None:
                applied = await self.store.apply_event(
                    str(event_id), self.bus.name(consumer) if self.bus else consumer, change.ops
                )
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
        change.commit()
        if change.released and self._term is not None:
            self._term.executor.released(change.released)

    def _stale(self, exc: StaleWriteError) -> None:
        """A newer leader wrote first: this one steps down."""
        if self._term is not None:
            self._spawn(self._term, self._step_down(exc), "step-down")

    def _commit_later(
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
        ``self._lock`` held.
        """
        assert self.store is not None
        if change is None:
            return None
        future = self.store.apply_event_nowait(
            str(event_id), self.bus.name(consumer) if self.bus else consumer, change.ops
        )
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

    async def _requeue_orphans(self, job_ids: list[str]) -> None:
        now = time.time()
        await self._commit(self.book.merge(self.book.requeue(job_id, now) for job_id in job_ids))

    def _send_revokes(self, change: Change) -> None:
        term = self._term
        if term is None:
            return
        for lease, reason in change.revokes:
            self._spawn(term, self._revoke_in_background(term, lease, reason), "revoke")

    async def _revoke_in_background(self, term: _Term, lease: Lease, reason: RevokeReason) -> None:
        """Revoke outside a round (cancel, terminate, unknown lease), then release at the deadline."""
        entry = self.book.entry(lease.job_id)
        grace = entry.state.spec.grace_period_s if entry is not None else 0.0
        deadline = lease.revoke_deadline or (time.time() + grace + self.cfg.revoke_margin_s)
        if term.dispatch is not None and not term.dispatch.done():
            await asyncio.wait([term.dispatch])  # never overtake the grant of this very lease
        try:
            ack = await term.executor.revoke(lease, reason, grace, deadline)
        except DeposedError as exc:
            await self._step_down(exc)
            return
        if lease.lease_id not in self.book.leases:
            return
        if ack is not None and ack.error is LeaseAckError.UNKNOWN_LEASE:
            async with self._lock:
                await self._commit(self.book.release(lease.lease_id, time.time(), count_preemption=False))
            return
        await term.executor.wait_released([lease], deadline, lambda i: i in self.book.leases)
        async with self._lock:
            await self._commit(self.book.release(lease.lease_id, time.time()))

    # --- admission's facts and user intent ---------------------------------------------------
    async def _on_arrived(self, event: JobArrived) -> Awaitable[None] | None:
        # Pipelined (see _commit_later): a fetched batch of arrivals becomes one transaction.
        async with self._lock:
            pending = self._commit_later(
                self.book.arrived(event.job_id, event.spec, event.ts),
                event_id=event.event_id,
                consumer=CONSUMERS[JOB_ARRIVED],
                on_conflict=lambda: log.info("job %s already exists; ignoring its new job.arrived", event.job_id),
            )
            if pending is not None:
                # job.accepted is consumed concurrently and may overtake this commit: let it wait.
                job_id = event.job_id
                self._arriving[job_id] = pending
                pending.add_done_callback(lambda _: self._arriving.pop(job_id, None))
            return pending

    async def _on_accepted(self, event: JobAccepted) -> Awaitable[None] | None:
        assert self.store is not None
        landing = self._arriving.get(event.job_id)
        if landing is not None and not landing.done():
            await asyncio.wait([landing])  # its job.arrived is committing right now
        async with self._lock:
            if self.book.entry(event.job_id) is None and await self.store.get_job(event.job_id) is not None:
                return None  # finished (e.g. cancelled) before admission answered
            change = self.book.accepted(event.job_id, time.time())
            # The round this arrival triggers must see the job: churn once the commit has landed.
            return self._commit_later(
                change, event_id=event.event_id, consumer=CONSUMERS[JOB_ACCEPTED],
                after=lambda: self._churn(RoundTrigger.ARRIVAL),
            )  # fmt: skip

    async def _on_held(self, event: JobHeld) -> None:
        self.book.held(event.job_id, event.reason).commit()

    async def _on_rejected(self, event: JobRejected) -> None:
        async with self._lock:
            change = self.book.rejected(event.job_id, event.reason, time.time())
            await self._commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_REJECTED])

    async def _on_cancel(self, event: JobCancel) -> None:
        assert self.store is not None
        now = time.time()
        async with self._lock:
            entry = self.book.entry(event.job_id)
            if entry is None and await self.store.get_job(event.job_id) is None:
                # Cancelled before its job.arrived was applied: redelivered with back-off until the
                # job exists (dead-lettered after the consumer's max_deliver if it never does).
                raise JobNotArrivedError(f"job {event.job_id!r} was cancelled before its job.arrived was applied")
            grace = entry.state.spec.grace_period_s if entry is not None else 0.0
            change = self.book.end(
                event.job_id,
                JobStatus.CANCELLED,
                RevokeReason.CANCEL,
                now=now,
                grace_deadline=now + grace + self.cfg.revoke_margin_s,
                message=event.reason or "cancelled",
            )
            applied = await self._commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_CANCEL])
        if applied:
            self._send_revokes(change)

    # --- workers' facts ----------------------------------------------------------------------
    @staticmethod
    def _fact_time(ts: float, start: float | None, now: float) -> float:
        """When a fact happened, on our clock as far as we can tell: its ``ts`` within [start, now]."""
        return min(now, max(ts, start if start is not None else ts))

    async def _on_started(self, event: JobStarted) -> None:
        now = time.time()
        lease = self.book.leases.get(event.lease_id)
        if lease is not None and lease.job_id == event.job_id:
            lease.started = True
            return
        if now - event.ts > self.cfg.lease_ttl_s or self._term is None:
            return  # history replayed on a new consumer: nothing runs there any more
        entry = self.book.entry(event.job_id)
        if entry is not None and entry.lease is not None and entry.lease.lease_id == event.lease_id:
            return
        # A lease we do not hold is running (granted by a deposed leader, or released at its
        # deadline): stop it; nobody else may count on those GPUs.
        stray = Lease(event.lease_id, event.job_id, ((event.node_id, tuple(event.gpus)),), event.epoch, now)
        self._spawn(self._term, self._revoke_stray(self._term, stray), "revoke-stray")

    async def _revoke_stray(self, term: _Term, lease: Lease) -> None:
        with contextlib.suppress(DeposedError):
            await term.executor.revoke(lease, RevokeReason.PREEMPT, 0.0, time.time() + self.cfg.request_timeout_s)

    async def _on_checkpointed(self, event: JobCheckpointed) -> None:
        # Persisted, not only kept in memory: a run lost after a failover must still rewind to it.
        async with self._lock:
            change = self.book.checkpointed(event.job_id, event.lease_id, event.checkpoint_path, event.iteration)
            await self._commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_CHECKPOINTED])

    async def _on_suspended(self, event: JobSuspended) -> None:
        now = time.time()
        # What survives a suspension is its checkpoint: the job resumes from the iteration the
        # checkpoint holds, not from event.iteration (later when the grace period ran out).
        ckpt_iter = event.checkpoint_iteration if event.checkpoint_path is not None else None
        async with self._lock:
            lease = self.book.leases.get(event.lease_id)
            change: Change | None
            if lease is not None and lease.job_id == event.job_id:
                entry = self.book.jobs[lease.job_id]
                at = self._fact_time(event.ts, entry.state.last_start_time, now)
                change = self.book.release(
                    event.lease_id, at, checkpoint=event.checkpoint_path, checkpoint_iteration=ckpt_iter,
                    iterations=ckpt_iter,
                )  # fmt: skip
            else:
                change = self.book.late_checkpoint(event.job_id, event.checkpoint_path, ckpt_iter)
            await self._commit(change, event_id=event.event_id, consumer=CONSUMERS[JOB_SUSPENDED])
        if event.reason is not SuspendReason.PREEMPTED:
            self._churn(RoundTrigger.COMPLETION)

    async def _on_metrics(self, entry: KVEntry) -> None:
        if self._term is not None:
            apply_metrics(self.book, entry, time.time())

    async def _on_suspension_seen(self, event: JobSuspended) -> None:
        """The fast path of a revoke: the same fact on core NATS, before the durable consumer has
        committed it. The round waiting for it may grant the GPUs at once: the worker's processes
        have exited, and the release's commit is queued ahead of any later write of the book
        (after a crash, the durable consumer redelivers the fact and the release happens then)."""
        lease = self.book.leases.get(event.lease_id)
        if lease is None or lease.job_id != event.job_id or lease.state is not LeaseState.REVOKING:
            return
        lease.stopped = True
        if self._term is not None:
            self._term.executor.released([lease.lease_id])

    async def _on_completed(self, event: JobCompleted) -> None:
        await self._finished(
            event, CONSUMERS[JOB_COMPLETED], JobStatus.COMPLETED, iteration=event.iteration, reason=None
        )

    async def _on_failed(self, event: JobFailed) -> None:
        reason = f"{event.reason.value}: {event.message}" if event.message else event.reason.value
        await self._finished(event, CONSUMERS[JOB_FAILED], JobStatus.FAILED, iteration=event.iteration, reason=reason)

    async def _finished(
        self,
        event: JobCompleted | JobFailed,
        consumer: str,
        status: JobStatus,
        *,
        iteration: int | None,
        reason: str | None,
    ) -> None:
        job_id, lease_id, ts, checkpoint = event.job_id, event.lease_id, event.ts, event.checkpoint_path
        now = time.time()
        async with self._lock:
            entry = self.book.entry(job_id)
            if entry is None:
                return
            if reason is not None:
                entry.reason = reason
            lease = entry.lease
            if lease is not None and (lease_id is None or lease.lease_id == lease_id):
                at = self._fact_time(ts, entry.state.last_start_time, now)
                change = self.book.release(
                    lease.lease_id, at, final=status, checkpoint=checkpoint, iterations=iteration
                )
            elif lease is None:
                change = self.book.finished_without_lease(job_id, status, now, checkpoint, iteration)
            elif status is JobStatus.COMPLETED and lease_id is not None:
                # The job completed under an earlier lease that was released before this durable
                # fact landed (reconcile_grace_s or a revoke deadline passed) and it has been granted
                # again since: its work is done, so it is completed and the re-run is stopped.
                log.warning("job %s completed under its earlier lease %s; revoking its re-run %s",
                            job_id, lease_id, lease.lease_id)  # fmt: skip
                grace = entry.state.spec.grace_period_s
                change = self.book.completed_under_earlier_lease(
                    job_id, min(ts, now), checkpoint, iteration, grace_deadline=now + grace + self.cfg.revoke_margin_s
                )
            else:
                return  # a failure of an earlier run of a job that runs under another lease now
            applied = await self._commit(change, event_id=event.event_id, consumer=consumer)
        if applied and change is not None:
            self._send_revokes(change)
        self._churn(RoundTrigger.COMPLETION)

    # --- nodes -----------------------------------------------------------------------------
    async def _on_register(self, event: NodeRegister) -> None:
        assert self.store is not None
        async with self._lock:
            restarted = self.inventory.register(event, time.monotonic())
            changes: list[Change | None] = []
            if restarted is not None:
                # A new incarnation: the leases it held are gone with their processes.
                for lease in self.book.leases_on(event.node_id):
                    changes.append(self.book.release(lease.lease_id, time.time()))
            change = self.book.merge(changes)
            change.ops.append(SetMeta(META_KEY, self.inventory.dumps()))
            await self._commit(change, event_id=event.event_id, consumer=CONSUMERS[NODE_REGISTER])
        self._churn(RoundTrigger.NODE_CHANGE)

    async def _on_heartbeat(self, event: NodeHeartbeat) -> None:
        if self._term is None:
            return
        if not self.inventory.heartbeat(event.node_id, event.incarnation, event.draining, time.monotonic()):
            return
        reported = {held.lease_id for held in event.leases}
        mine = self.book.by_node.get(event.node_id, set())
        cutoff = event.ts - self.cfg.reconcile_grace_s
        missing = self._missing_since
        for lease_id in reported:
            missing.pop(lease_id, None)
        # A worker drops a lease right after queueing its job.completed/failed, and that fact travels
        # on a durable consumer that may lag this heartbeat. So an omitted lease counts as lost only
        # once it has been missing for reconcile_grace_s (and was granted before that), giving the
        # fact time to land first: releasing it early would requeue a finished job.
        lost = []
        for lease_id in mine:
            if lease_id in reported or self.book.leases[lease_id].granted_at >= cutoff:
                continue
            first = missing.setdefault(lease_id, event.ts)
            if first <= cutoff:
                lost.append(lease_id)
        for lease_id in [i for i in missing if i not in self.book.leases]:
            del missing[lease_id]  # released through its fact meanwhile
        unknown = [h for h in event.leases if h.lease_id not in mine and h.epoch <= self._term.epoch]
        if lost:
            async with self._lock:
                changes = [self.book.release(i, time.time()) for i in lost if i in self.book.leases]
                await self._commit(self.book.merge(changes))
            self._churn(RoundTrigger.NODE_CHANGE)
        for held in unknown:
            stray = Lease(held.lease_id, held.job_id, ((event.node_id, tuple(held.gpus)),), held.epoch, time.time())
            self._spawn(self._term, self._revoke_stray(self._term, stray), "revoke-stray")

    async def _sweep_loop(self, term: _Term) -> None:
        """Dead nodes and revokes past their deadline, checked a few times per TTL."""
        interval = min(1.0, self.cfg.lease_ttl_s / 4)
        while self._term is term:
            await asyncio.sleep(interval)
            try:
                await self._sweep()
            except StaleWriteError:
                return
            except Exception:
                log.exception("sweep failed")

    async def _sweep(self) -> None:
        dead = self.inventory.sweep(time.monotonic())
        now = time.time()
        async with self._lock:
            changes: list[Change | None] = []
            for node_id in dead:
                log.warning("node %s silent for %.0f s: its jobs are requeued", node_id, self.cfg.lease_ttl_s)
                changes.extend(self.book.release(lease.lease_id, now) for lease in self.book.leases_on(node_id))
            released = {i for c in changes if c is not None for i in c.released}
            for lease in list(self.book.leases.values()):
                if lease.lease_id in released or lease.revoke_deadline is None or lease.revoke_deadline > now:
                    continue
                if self._term is None or not self._term.executor.is_awaited(lease.lease_id):
                    changes.append(self.book.release(lease.lease_id, now))
            if changes:
                await self._commit(self.book.merge(changes))
        if dead:
            self._churn(RoundTrigger.NODE_CHANGE)

    # --- queries -----------------------------------------------------------------------------
    async def _on_query(self, query: JobsQuery) -> JobsReply:
        term = self._term
        if term is None or self.store is None:
            raise RuntimeError("not the leader; ask again (the leader answers query.jobs)")
        finished: list[JobRecord] = []
        if (
            query.include_finished
            or query.job_ids
            or any(JobStatus(s).is_final for s in query.statuses if s in JobStatus._value2member_map_)
        ):
            if query.job_ids:
                for job_id in query.job_ids:
                    record = await self.store.get_job(job_id)
                    if record is not None and record.status.is_final:
                        finished.append(record)
            else:
                finals = [s for s in JobStatus if s.is_final]
                finished = (await self.store.jobs_by_status(*finals))[-self.cfg.query_finished_limit :]
        context = self._waiting_context() if self.book.waiting_count() else None
        return answer(query, self.book, finished, time.time(), term.epoch, context=context)

    def _waiting_context(self) -> WaitingContext:
        """The cluster now (live GPUs, every held lease assigned) and the last round's order, to
        say why queued jobs wait. A fresh ``ClusterState``: the round's own is as of its snapshot."""
        topology = self._current_topology()
        cluster = topology.cluster()
        for job_id, lease in self.book.held_gpus():
            with contextlib.suppress(UnknownGpuError):  # a lease on a node that went silent
                cluster.assign(job_id, topology.lease_gpus(lease))
        number, ranked = self._last_ranked

        def is_waiting(job_id: str) -> bool:
            entry = self.book.entry(job_id)
            return entry is not None and entry.state.status is JobStatus.QUEUED

        return WaitingContext.after_round(cluster, ranked, is_waiting, number)

    # --- rounds ------------------------------------------------------------------------------
    def _churn(self, reason: RoundTrigger) -> None:
        if self._term is not None:
            self._term.timer.churn(reason)

    def request_round(self) -> None:
        """Run a round now (tests, operators)."""
        if self._term is not None:
            self._term.timer.soon()

    async def _round_loop(self, term: _Term) -> None:
        while self._term is term:
            cue = await term.timer.next_cue()
            if self._term is not term:
                return
            try:
                await self.run_round(cue.trigger, fill_only=cue.fill_only)
            except (DeposedError, StaleWriteError) as exc:
                await self._step_down(exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("round failed")

    def _run_start(self, job_id: str) -> tuple[float, float]:
        """A running job's attained service and executed seconds when its current run began."""
        entry = self.book.entry(job_id)
        return (entry.service0, entry.executed0) if entry is not None else (0.0, 0.0)

    def _current_topology(self) -> Topology:
        if self._topology is None or self._topology.version != self.inventory.version:
            self._topology = Topology(self.inventory.live(), self.inventory.version)
        return self._topology

    def build_snapshot(self, now: float) -> tuple[Topology, ClusterState]:
        """The cluster as policies see it: live nodes' GPUs, those held by any lease assigned.

        The ``ClusterState`` is kept from round to round (rebuilt only when the live nodes change)
        and brought up to date by releasing and assigning only what changed since the last round.
        """
        topology = self._current_topology()
        if self._cluster is None or self._cluster_topology is not topology:
            self._cluster = topology.cluster()
            self._cluster_topology = topology
            self._assigned = {}
        cluster, assigned = self._cluster, self._assigned
        current: dict[str, tuple[int, ...]] = {}
        for job_id, lease in self.book.held_gpus():
            try:
                current[job_id] = topology.lease_gpus(lease)
            except UnknownGpuError:
                continue
        draining = [info for info in topology.infos if info.draining]
        if draining:  # their free GPUs are held by a marker, so no policy places work there
            taken = {g for gpus in current.values() for g in gpus}
            current[UNAVAILABLE] = tuple(g for info in draining for g in topology.to_global(info.node_id, info.gpus)
                                         if g not in taken)  # fmt: skip
        for job_id, gpus in list(assigned.items()):
            if current.get(job_id) != gpus:
                cluster.release(job_id, gpus)
                del assigned[job_id]
        for job_id, gpus in current.items():
            if job_id not in assigned:
                cluster.assign(job_id, gpus)
                assigned[job_id] = gpus
        self.book.refresh(now, topology, restore_allowance_s=self.cfg.restore_allowance_s)
        return topology, cluster

    async def run_round(
        self, trigger: RoundTrigger = RoundTrigger.MANUAL, *, fill_only: bool = False
    ) -> ValidPlan | None:
        """One round: snapshot, rank, publish, wait for the plan, execute its valid parts.

        ``fill_only``: a fill round (``services.scheduler.rounds``): placement may only put waiting
        jobs on free GPUs, and any suspension in its plan is dropped; skipped when nothing could
        start (no free GPU or no waiting job)."""
        term = self._term
        if term is None or self.bus is None:
            return None
        await self._sweep()
        if not self.book.active or (fill_only and not self.book.waiting_count()):
            return None
        timings = RoundTimings()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        now = time.time()
        topology, cluster = self.build_snapshot(now)
        if fill_only and not cluster.free_gpu_count:
            return None
        jobs = dict(self.book.active)
        t1 = time.perf_counter()
        ranking = rank_step(self.policy, jobs, cluster, now, fill_only=fill_only)
        ranked = list(ranking.order)
        t2 = time.perf_counter()
        self._round_no += 1
        number = self._round_no
        version = self.book.state_version
        timings.round = number
        self.snapshot = RoundSnapshot(number, term.epoch, version, now, ranking, jobs, cluster, topology)
        self._last_ranked = (number, ranked)
        held = {job_id: gpus for job_id, gpus in self._assigned.items()
                if (state := jobs.get(job_id)) is None or not state.is_running}  # fmt: skip
        plan: PlacementPlan | None = None
        t3 = t4 = time.perf_counter()
        for _ in range(2):  # a delta the instance cannot apply is sent again in full, once
            writer = self._snapshots
            snapshot = writer.encode(
                now=now, jobs=jobs, run_start=self._run_start, nodes=topology.infos, to_local=topology.to_local,
                held=held,
            )  # fmt: skip
            peer = writer.peer
            # Built without re-validating 20,000 ids: every one came from a validated event (the codec
            # checks this message again on the placement side).
            message = ScheduleRound.model_construct(
                epoch=term.epoch, round=number, state_version=version, trigger=trigger, policy=self.policy.name,
                ranked=ranked, gpu_targets=dict(ranking.gpu_targets), terminate=dict(ranking.terminate),
                preempt=ranking.preempt, fill_only=fill_only, to=peer or ANY_PLACEMENT, snapshot=snapshot,
            )  # fmt: skip
            future: asyncio.Future[PlacementPlan] = asyncio.get_running_loop().create_future()
            term.pending_plan = (number, version, future)
            t3 = time.perf_counter()
            try:
                await self.bus.publish(schedule_round(peer or ANY_PLACEMENT), message)
            except nats.errors.MaxPayloadError:
                writer.forget()
                term.pending_plan = None
                log.error("round %d: its snapshot (%d jobs sent) is over the broker's max_payload; raise "
                          "max_payload in the NATS server configuration", number, len(snapshot.jobs))  # fmt: skip
                return None
            t4 = time.perf_counter()
            try:
                plan = await asyncio.wait_for(future, self.cfg.plan_timeout_s)
            except TimeoutError:
                self.plans_timed_out += 1
                writer.forget()  # the instance may be gone: the next round goes to any, in full
                log.warning("no placement.plan for round %d within %.1f s", number, self.cfg.plan_timeout_s)
                return None
            finally:
                term.pending_plan = None
            if not plan.resync:
                break
            self.plans_resynced += 1
            writer.forget()
            plan = None
        if plan is None:
            return None
        if plan.error is not None or plan.instance is None:
            self._snapshots.forget()
            log.warning("placement refused round %d: %s", number, plan.error or "no instance named")
            return None
        self._snapshots.acknowledged(plan.instance, snapshot.version)
        t5 = time.perf_counter()
        # Snapshot to plan: what a round costs (the revoke waits after it are idle time).
        term.timer.ran(t5 - t0)
        if fill_only and plan.suspend:
            # Placement keeps only fill launches in a fill round (core/fill.py); a plan that suspends
            # anyway loses its suspensions, and launches onto GPUs they would free (and moves) then
            # fail validation below and are dropped with a reason.
            log.info("fill round %d: dropped %d suspensions", number, len(plan.suspend))
            plan = plan.model_copy(update={"suspend": []})
        valid = validate_plan(plan, self.book, self.inventory, dict(ranking.gpu_targets))
        if valid.dropped:
            log.info("round %d: dropped %d plan parts: %s", number, len(valid.dropped), valid.dropped[:5])
        await self.execute(valid, term, timings)
        self._spawn(term, self._record(number, term.epoch, version, valid, topology), "record-round")
        t6 = time.perf_counter()
        timings.cpu = time.process_time() - cpu0
        timings.snapshot = t1 - t0
        timings.rank = t2 - t1
        timings.encode = t3 - t2
        timings.publish = t4 - t3
        timings.placement = t5 - t4
        timings.apply = t6 - t5
        timings.launched = len(valid.launch)
        timings.suspended = len(valid.suspend)
        timings.dropped = len(valid.dropped)
        self.timings = timings
        self.rounds_run += 1
        for listener in self._round_listeners:
            result = listener(valid)
            if result is not None:
                await result
        return valid

    async def _on_plan(self, plan: PlacementPlan) -> None:
        term = self._term
        pending = term.pending_plan if term is not None else None
        if term is None or pending is None:
            self.plans_stale += 1
            return
        number, version, future = pending
        if (plan.round, plan.state_version, plan.epoch) != (number, version, term.epoch) or future.done():
            self.plans_stale += 1
            log.debug("ignoring plan for round %d (waiting for %d)", plan.round, number)
            return
        future.set_result(plan)

    async def _record(self, number: int, epoch: int, version: int, valid: ValidPlan, topology: Topology) -> None:
        if valid.is_empty:
            return
        launch: dict[str, tuple[int, ...]] = {}
        for job_id, parts in valid.launch.items():
            with contextlib.suppress(UnknownGpuError):
                launch[job_id] = tuple(g for node, local in parts for g in topology.to_global(node, local))
        plan = Plan(launch=launch, suspend=tuple(valid.suspend), terminate=dict(valid.terminate))
        ops: list[WriteOp] = [RecordRound(RoundRecord(number, epoch, version, time.time(), plan))]
        assert self.store is not None
        try:
            await self.store.submit(ops)
        except Exception as exc:  # a round number a previous term used: audit only, never fatal
            log.warning("round %d not recorded: %r", number, exc)

    async def execute(self, valid: ValidPlan, term: _Term, timings: RoundTimings | None = None) -> None:
        """Revokes first, wait for the suspensions (or their deadlines), then grants."""
        timings = timings or RoundTimings()
        if term.dispatch is not None and not term.dispatch.done():
            await asyncio.wait([term.dispatch])  # the previous round's grants first
        t0 = time.perf_counter()
        executor = term.executor
        now = time.time()
        margin = self.cfg.revoke_margin_s
        async with self._lock:
            changes: list[Change | None] = []
            for job_id, reason in valid.terminate.items():
                entry = self.book.entry(job_id)
                if entry is None:
                    continue
                grace = entry.state.spec.grace_period_s
                changes.append(
                    self.book.end(
                        job_id,
                        JobStatus.COMPLETED,
                        RevokeReason.TERMINATE,
                        now=now,
                        grace_deadline=now + grace + margin,
                        message=reason,
                    )
                )
            for job_id in valid.suspend:
                entry = self.book.entry(job_id)
                if entry is None:
                    continue
                reason = RevokeReason.MIGRATE if job_id in valid.launch else RevokeReason.PREEMPT
                changes.append(self.book.revoke(job_id, reason, now + entry.state.spec.grace_period_s + margin))
            stopping = self.book.merge(changes)
            await self._commit(stopping)
        if stopping.revokes:
            await self._stop_leases(executor, stopping.revokes, timings)
        t1 = time.perf_counter()
        await self._grant(executor, valid, timings)
        timings.grant = time.perf_counter() - t1
        timings.revoke = t1 - t0 - timings.wait

    async def _stop_leases(
        self, executor: LeaseExecutor, revokes: list[tuple[Lease, RevokeReason]], timings: RoundTimings
    ) -> None:
        def grace_of(lease: Lease) -> float:
            entry = self.book.entry(lease.job_id)
            return entry.state.spec.grace_period_s if entry is not None else 0.0

        deadline = max((lease.revoke_deadline or time.time()) for lease, _ in revokes)
        acks = await asyncio.gather(
            *(executor.revoke(lease, reason, grace_of(lease), lease.revoke_deadline or deadline)
              for lease, reason in revokes),
            return_exceptions=True,
        )  # fmt: skip
        for result in acks:
            if isinstance(result, DeposedError):
                raise result
        gone = [
            lease.lease_id for (lease, _), ack in zip(revokes, acks, strict=True)
            if not isinstance(ack, BaseException) and ack is not None and ack.error is LeaseAckError.UNKNOWN_LEASE
        ]  # fmt: skip
        if gone:
            async with self._lock:
                await self._commit(self.book.merge(
                    self.book.release(i, time.time(), count_preemption=False) for i in gone
                ))  # fmt: skip
        leases = [lease for lease, _ in revokes if lease.lease_id in self.book.leases]
        t0 = time.perf_counter()
        late = await executor.wait_released(leases, deadline, self._still_running)
        timings.wait = time.perf_counter() - t0
        if late:
            log.warning("%d revokes passed their deadline without job.suspended; releasing", len(late))
            async with self._lock:
                await self._commit(self.book.merge(self.book.release(i, time.time()) for i in late))

    def _still_running(self, lease_id: str) -> bool:
        lease = self.book.leases.get(lease_id)
        return lease is not None and not lease.stopped

    async def _grant(self, executor: LeaseExecutor, valid: ValidPlan, timings: RoundTimings) -> None:
        if not valid.launch:
            return
        moving = [
            lease
            for job_id in valid.launch
            if (entry := self.book.entry(job_id)) is not None and (lease := entry.lease) is not None and lease.stopped
        ]
        if moving:  # a migrating job is granted again only once its release is committed
            await executor.wait_released(moving, time.time() + 5.0, lambda i: i in self.book.leases)
        now = time.time()
        async with self._lock:
            held_on: dict[str, set[int]] = {}
            changes: list[Change | None] = []
            leases: list[Lease] = []
            for job_id, parts in valid.launch.items():
                taken = False
                for node, gpus in parts:
                    if node not in held_on:
                        held_on[node] = self.book.gpus_held_on(node, skip_stopped=True)
                    taken = taken or bool(held_on[node].intersection(gpus)) or not self.inventory.is_live(node)
                if taken:
                    continue
                lease = Lease(new_lease_id(), job_id, parts, executor.epoch, now)
                change = self.book.grant(job_id, lease, now)
                if change is not None:
                    for node, gpus in parts:
                        held_on[node].update(gpus)
                    changes.append(change)
                    leases.append(lease)
            await self._commit(self.book.merge(changes))
        if leases and self._term is not None:
            term = self._term
            started = time.perf_counter()
            term.dispatch = asyncio.ensure_future(self._dispatch_grants(executor, leases, timings, started))
            term.tasks.add(term.dispatch)
            term.dispatch.add_done_callback(term.tasks.discard)

    async def _dispatch_grants(
        self, executor: LeaseExecutor, leases: list[Lease], timings: RoundTimings, started: float
    ) -> None:
        """Send a round's grants and wait for the acks, after the round itself has ended (as
        kube-scheduler binds after its scheduling cycle): the leases are in the store already,
        and a grant no worker takes is rolled back here. The next round's execution waits for
        this to finish, so its revokes never overtake these grants."""
        try:
            await self._send_grants(executor, leases)
        except (DeposedError, StaleWriteError) as exc:
            await self._step_down(exc)
        finally:
            timings.grants_acked = time.perf_counter() - started

    async def _send_grants(self, executor: LeaseExecutor, leases: list[Lease]) -> None:
        results = await asyncio.gather(*(self._send_grant(executor, lease) for lease in leases), return_exceptions=True)
        failed: list[str] = []
        for lease, result in zip(leases, results, strict=True):
            if isinstance(result, DeposedError):
                raise result
            if isinstance(result, BaseException):
                log.warning("%s", result)
                failed.append(lease.lease_id)
        if failed:
            async with self._lock:
                await self._commit(self.book.merge(self.book.grant_failed(i) for i in failed))

    async def _send_grant(self, executor: LeaseExecutor, lease: Lease) -> None:
        entry = self.book.entry(lease.job_id)
        if entry is None:
            raise GrantRefusedError(f"job {lease.job_id} is gone")
        state = entry.state
        await executor.grant(
            lease, state.spec, resume_from=entry.checkpoint_path,
            # Fixed at the grant's commit: the iteration a report must pass to count as this run's
            # progress (resume.py); the metrics may have moved iterations_done since.
            resume_iteration=lease.from_iteration if entry.checkpoint_path else None,
            attempt=state.preemptions + 1,
        )  # fmt: skip
