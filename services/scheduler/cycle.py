"""The scheduling cycle: one round on one snapshot (docs/control-plane.md, "A round").

Sweep, build the snapshot from the book (the ``ClusterState`` kept between rounds and updated by
what changed), rank with the scheduling policy (``services.core.round.rank_step``), publish
``ScheduleRound`` carrying its snapshot (``services.core.snapshot.SnapshotWriter``: in full to any
placement instance, then as deltas to the one that answered), wait for the ``PlacementPlan`` that
answers this round, keep its valid parts (``rounds.validate_plan``), execute them
(``execution.py``) and record the round in the background. The ``RoundTimer`` (``rounds.py``)
decides when the next round runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.errors

from schemas.rounds import PlacementPlan, RoundTrigger, ScheduleRound
from schemas.subjects import ANY_PLACEMENT, schedule_round
from services.core.decisions import Plan, Ranking
from services.core.protocols import SchedulingPolicy
from services.core.round import rank_step
from services.core.snapshot import SnapshotWriter
from services.core.state import UNAVAILABLE, ClusterState, JobState, JobStatus
from services.runtime.store import RecordRound, RoundRecord, StaleWriteError, WriteOp
from services.scheduler.execution import Execution
from services.scheduler.executor import DeposedError
from services.scheduler.inventory import NodeInfo
from services.scheduler.queries import WaitingContext
from services.scheduler.replica import Replica
from services.scheduler.rounds import ValidPlan, validate_plan
from services.scheduler.term import Term
from services.scheduler.timings import RoundTimings
from services.scheduler.topology import Topology, UnknownGpuError

log = logging.getLogger("roundhouse.scheduler")

Sweep = Callable[[], Awaitable[None]]
"""Releases what is due before a round (``NodeFacts.sweep``)."""


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


class RoundCycle:
    """Runs the rounds of the term the replica leads, with ``policy``."""

    def __init__(self, replica: Replica, policy: SchedulingPolicy, execution: Execution, sweep: Sweep) -> None:
        self.replica = replica
        self.policy = policy
        self.execution = execution
        self._sweep = sweep
        self.timings = RoundTimings()
        self.snapshot: RoundSnapshot | None = None
        self.last_ranked: tuple[int | None, list[str]] = (None, [])
        """The last round's number and ranked job ids (``roundhouse jobs`` says where queued jobs stand)."""
        self.rounds_run = 0
        self.cues_taken = 0
        """Rounds the loop has begun (a cue taken), whether or not they placed anything: a round with
        nothing to do counts here, not in ``rounds_run``."""
        self.in_round = False
        self.plans_stale = 0
        self.plans_timed_out = 0
        self.plans_resynced = 0
        self.snapshots = SnapshotWriter()
        """What the placement instance we talk to holds (rounds carry their snapshot, as deltas)."""
        self.on_round: Callable[[RoundTimings, RoundTrigger], None] | None = None
        """Called with each completed round's timings (the Prometheus histograms, ``monitoring.py``)."""
        self._round_no = 0
        self._topology: Topology | None = None
        self._cluster: ClusterState | None = None
        self._cluster_topology: Topology | None = None
        self._assigned: dict[str, tuple[int, ...]] = {}

    def begin_term(self, last_round: int) -> None:
        """A new term: round numbers go on from the last recorded one; nothing is assumed of the
        cluster or of what a placement instance holds."""
        self._round_no = last_round
        self._topology = None
        self._cluster = None
        self.snapshots.forget()

    def request_round(self) -> None:
        """Run a round now (tests, operators)."""
        term = self.replica.term
        if term is not None:
            term.timer.soon()

    async def round_loop(self, term: Term) -> None:
        r = self.replica
        while r.term is term:
            cue = await term.timer.next_cue()
            if r.term is not term:
                return
            self.cues_taken += 1
            self.in_round = True
            try:
                await self.run_round(cue.trigger, fill_only=cue.fill_only)
            except (DeposedError, StaleWriteError) as exc:
                await r.step_down(exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("round failed")
            finally:
                self.in_round = False

    # --- the snapshot ------------------------------------------------------------------------
    def _run_start(self, job_id: str) -> tuple[float, float]:
        """A running job's attained service and executed seconds when its current run began."""
        entry = self.replica.book.entry(job_id)
        return (entry.service0, entry.executed0) if entry is not None else (0.0, 0.0)

    def current_topology(self) -> Topology:
        inventory = self.replica.inventory
        if self._topology is None or self._topology.version != inventory.version:
            self._topology = Topology(inventory.live(), inventory.version)
        return self._topology

    def build_snapshot(self, now: float) -> tuple[Topology, ClusterState]:
        """The cluster as policies see it: live nodes' GPUs, those held by any lease assigned.

        The ``ClusterState`` is kept from round to round (rebuilt only when the live nodes change)
        and brought up to date by releasing and assigning only what changed since the last round.
        """
        book = self.replica.book
        topology = self.current_topology()
        if self._cluster is None or self._cluster_topology is not topology:
            self._cluster = topology.cluster()
            self._cluster_topology = topology
            self._assigned = {}
        cluster, assigned = self._cluster, self._assigned
        current: dict[str, tuple[int, ...]] = {}
        for job_id, lease in book.held_gpus():
            try:
                current[job_id] = topology.lease_gpus(lease)
            except UnknownGpuError:
                continue
        withheld = self._withheld(topology)
        if withheld:  # their free GPUs are held by a marker, so no policy places work there
            taken = {g for gpus in current.values() for g in gpus}
            current[UNAVAILABLE] = tuple(g for info in withheld for g in topology.to_global(info.node_id, info.gpus)
                                         if g not in taken)  # fmt: skip
        for job_id, gpus in list(assigned.items()):
            if current.get(job_id) != gpus:
                cluster.release(job_id, gpus)
                del assigned[job_id]
        for job_id, gpus in current.items():
            if job_id not in assigned:
                cluster.assign(job_id, gpus)
                cluster.mark_shared(gpus)  # a no-op unless packed leases hold them together
                assigned[job_id] = gpus
        book.refresh(now, topology, restore_allowance_s=self.replica.cfg.restore_allowance_s)
        return topology, cluster

    def _withheld(self, topology: Topology) -> list[NodeInfo]:
        """Live nodes that take no new work now: draining, or silent past ``node_silent_s`` (a node
        that departed or lost its network). Their leases stand until the TTL; their free GPUs are
        not offered (issue 15, item 4)."""
        inventory = self.replica.inventory
        now = self.replica.clock.monotonic()
        return [info for info in topology.infos if not inventory.takes_work(info, now)]

    def withheld_gpus(self, topology: Topology) -> tuple[int, ...]:
        """Global ids of every GPU (free or leased) on the live nodes that take no new work now
        (``_withheld``): what the ETA's forward simulation holds unavailable."""
        return tuple(g for info in self._withheld(topology) for g in topology.to_global(info.node_id, info.gpus))

    def waiting_context(self) -> WaitingContext:
        """The cluster now (live GPUs, every held lease assigned) and the last round's order, to
        say why queued jobs wait. A fresh ``ClusterState``: the round's own is as of its snapshot."""
        book = self.replica.book
        topology = self.current_topology()
        cluster = topology.cluster()
        for job_id, lease in book.held_gpus():
            with contextlib.suppress(UnknownGpuError):  # a lease on a node that went silent
                cluster.assign(job_id, topology.lease_gpus(lease))
        withheld = [g for info in self._withheld(topology) for g in topology.to_global(info.node_id, info.gpus)
                    if cluster.is_free(g)]  # fmt: skip
        if withheld:  # not free for the reasons either: "needs 4 GPUs, 0 of 8 free"
            cluster.assign(UNAVAILABLE, tuple(withheld))
        number, ranked = self.last_ranked

        def is_waiting(job_id: str) -> bool:
            entry = book.entry(job_id)
            return entry is not None and entry.state.status is JobStatus.QUEUED

        return WaitingContext.after_round(cluster, ranked, is_waiting, number)

    # --- one round ---------------------------------------------------------------------------
    async def run_round(
        self, trigger: RoundTrigger = RoundTrigger.MANUAL, *, fill_only: bool = False
    ) -> ValidPlan | None:
        """One round: snapshot, rank, publish, wait for the plan, execute its valid parts.

        ``fill_only``: a fill round (``services.scheduler.rounds``): placement may only put waiting
        jobs on free GPUs, and any suspension in its plan is dropped; skipped when nothing could
        start (no free GPU or no waiting job)."""
        r = self.replica
        term = r.term
        bus = r.bus
        if term is None or bus is None:
            return None
        await self._sweep()
        book = r.book
        if not book.active or (fill_only and not book.waiting_count()):
            return None
        timings = RoundTimings()
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        now = r.clock.time()
        topology, cluster = self.build_snapshot(now)
        if fill_only and not cluster.free_gpu_count:
            return None
        jobs = dict(book.active)
        t1 = time.perf_counter()
        ranking = rank_step(self.policy, jobs, cluster, now, fill_only=fill_only)
        ranked = list(ranking.order)
        t2 = time.perf_counter()
        self._round_no += 1
        number = self._round_no
        version = book.state_version
        timings.round = number
        self.snapshot = RoundSnapshot(number, term.epoch, version, now, ranking, jobs, cluster, topology)
        self.last_ranked = (number, ranked)
        held = {job_id: gpus for job_id, gpus in self._assigned.items()
                if (state := jobs.get(job_id)) is None or not state.is_running}  # fmt: skip
        plan: PlacementPlan | None = None
        t3 = t4 = time.perf_counter()
        for _ in range(2):  # a delta the instance cannot apply is sent again in full, once
            writer = self.snapshots
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
                await bus.publish(schedule_round(peer or ANY_PLACEMENT), message)
            except nats.errors.MaxPayloadError:
                writer.forget()
                term.pending_plan = None
                log.error("round %d: its snapshot (%d jobs sent) is over the broker's max_payload; raise "
                          "max_payload in the NATS server configuration", number, len(snapshot.jobs))  # fmt: skip
                return None
            t4 = time.perf_counter()
            try:
                plan = await asyncio.wait_for(future, r.cfg.plan_timeout_s)
            except TimeoutError:
                self.plans_timed_out += 1
                writer.forget()  # the instance may be gone: the next round goes to any, in full
                log.warning("no placement.plan for round %d within %.1f s", number, r.cfg.plan_timeout_s)
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
            self.snapshots.forget()
            log.warning("placement refused round %d: %s", number, plan.error or "no instance named")
            return None
        self.snapshots.acknowledged(plan.instance, snapshot.version)
        t5 = time.perf_counter()
        # Snapshot to plan: what a round costs (the revoke waits after it are idle time).
        term.timer.ran(t5 - t0)
        if fill_only and plan.suspend:
            # Placement keeps only fill launches in a fill round (core/fill.py); a plan that suspends
            # anyway loses its suspensions, and launches onto GPUs they would free (and moves) then
            # fail validation below and are dropped with a reason.
            log.info("fill round %d: dropped %d suspensions", number, len(plan.suspend))
            plan = plan.model_copy(update={"suspend": []})
        valid = validate_plan(
            plan, r.book, r.inventory, dict(ranking.gpu_targets), now=r.clock.monotonic(), packing=r.cfg.packing
        )
        if valid.dropped:
            log.info("round %d: dropped %d plan parts: %s", number, len(valid.dropped), valid.dropped[:5])
        await self.execution.execute(valid, term, timings)
        term.spawn(self._record(number, term.epoch, version, valid, topology), "record-round")
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
        if self.on_round is not None:
            self.on_round(timings, trigger)
        return valid

    async def on_plan(self, plan: PlacementPlan) -> None:
        term = self.replica.term
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
        ops: list[WriteOp] = [RecordRound(RoundRecord(number, epoch, version, self.replica.clock.time(), plan))]
        store = self.replica.store
        assert store is not None
        try:
            await store.submit(ops)
        except Exception as exc:  # a round number a previous term used: audit only, never fatal
            log.warning("round %d not recorded: %r", number, exc)
