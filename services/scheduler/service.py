"""The scheduler service: owns jobs and leases, runs rounds, executes plans, leads one term at a time.

Every replica campaigns for the leader key (``leader.py``); only the leader does anything else.
:class:`SchedulerService` is the entry point and the wiring; the work is split by concern, each part
holding the :class:`~services.scheduler.replica.Replica` they share (the settings, the clock, the
book and its one write path, the inventory, the term):

* ``term.py`` — on election, load and start a term's consumers, subscriptions and tasks; on
  deposition, stop them all before another replica can act;
* ``facts.py`` and ``nodes.py`` — facts into the book (admission, users, workers; registrations,
  heartbeats and the sweep), each committed before its consumer acks;
* ``reconcile.py`` — what heartbeats, stray facts and the passing of time imply (pure, on ``now``);
* ``cycle.py`` — one round (docs/control-plane.md, "A round"): snapshot -> rank -> publish
  ``ScheduleRound`` with its snapshot -> wait for placement's ``PlacementPlan`` -> keep its valid
  parts -> execute -> record;
* ``execution.py`` — revokes first, wait for ``job.suspended`` or the grace deadline, then grants
  (the wire side is ``executor.py``).

The clock is passed in (``clock=``, default the real one): every time the scheduler decides by
(deadlines, TTLs, ages of facts, the round cadence) is read from it.
"""

from __future__ import annotations

from typing import Any

from schemas.control import AdmissionQuery, AdmissionReply, JobsQuery, JobsReply
from schemas.logs import LogsQuery
from schemas.rounds import RoundTrigger
from schemas.subjects import QUERY_LOGS
from services.core.protocols import SchedulingPolicy
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobStatus
from services.runtime.bus import Bus
from services.runtime.clock import SYSTEM_CLOCK, Clock
from services.runtime.config import ServiceConfig
from services.runtime.consumer import ConsumerOptions
from services.runtime.service import RoundhouseService
from services.runtime.store import JobRecord, Store
from services.scheduler.book import JobBook
from services.scheduler.config import SchedulerConfig
from services.scheduler.cycle import RoundCycle, RoundSnapshot
from services.scheduler.eta_leader import LeaderEta
from services.scheduler.execution import Execution
from services.scheduler.facts import JobFacts
from services.scheduler.inventory import Inventory
from services.scheduler.leader import LeaderElection
from services.scheduler.logs_query import LogsAnswerer
from services.scheduler.monitoring import SchedulerMonitor
from services.scheduler.nodes import NodeFacts
from services.scheduler.operator_api import OperatorApi, OperatorLeadership
from services.scheduler.queries import answer, answer_admission, wait_applied_through
from services.scheduler.replica import CONSUMERS, Replica
from services.scheduler.rounds import ValidPlan
from services.scheduler.term import Leadership, Term
from services.scheduler.timings import RoundTimings
from services.scheduler.topology import Topology

ADMISSION_WAIT_S = 2.0
"""How long ``query.admission`` waits for this leader to apply the facts it must reflect."""

__all__ = ["CONSUMERS", "RoundSnapshot", "RoundTimings", "SchedulerConfig", "SchedulerService"]


class SchedulerService(RoundhouseService):
    """One scheduler replica (``roundhouse service scheduler``)."""

    kind = "scheduler"
    description = "Roundhouse scheduler: jobs, leases, rounds; one leader among replicas"
    config_model = SchedulerConfig

    def __init__(
        self, config: ServiceConfig, *, consumer_options: ConsumerOptions | None = None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        if not isinstance(config, SchedulerConfig):
            config = SchedulerConfig.model_validate(config.model_dump())
        super().__init__(config)
        self.cfg: SchedulerConfig = config
        self.clock = clock
        self.policy: SchedulingPolicy = SCHEDULING.create(config.policy, **config.policy_options)
        self.consumer_options = consumer_options or ConsumerOptions(fetch_timeout_s=0.25)
        self.replica = Replica(config, clock)
        self.execution = Execution(self.replica)
        self.facts = JobFacts(self.replica, self.execution)
        self.nodes = NodeFacts(self.replica, self.execution)
        self.cycle = RoundCycle(self.replica, self.policy, self.execution, self.nodes.sweep)
        self.operator_api = OperatorApi(
            self.replica, self.execution, self.cycle, instance=self.instance, policy=self.policy
        )
        """``query.nodes``, ``query.status`` and ``operator.drain``, served by each term (``operator_api.py``)."""
        self.leadership: Leadership = OperatorLeadership(
            self.replica, facts=self.facts, nodes=self.nodes, cycle=self.cycle, execution=self.execution,
            on_query=self._on_query, consumer_options=self.consumer_options,
            on_admission_query=self._on_admission_query, operator_api=self.operator_api,
        )  # fmt: skip
        self.monitor = SchedulerMonitor(self.replica, self.metrics_registry)
        self.replica.on_landed = self.monitor.landed
        self.cycle.on_round = self.monitor.round_ended
        self.eta = LeaderEta(self.replica, self.cycle, config)
        """Queued jobs' expected starts (``eta.py``), refreshed off the event loop while leading."""

    # --- lifecycle --------------------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        r = self.replica
        r.bus = bus
        r.store = await Store.open(self.cfg.db)
        # The election keeps the real clock: the leader key's TTL runs on the broker's (leader.py).
        r.election = LeaderElection(
            bus, self.instance, ttl_s=self.cfg.leader_ttl_s,
            on_elected=self._on_elected, on_deposed=self.leadership.on_deposed,
        )  # fmt: skip
        await r.election.start()
        self.eta.start()

    async def _on_elected(self, revision: int) -> None:
        """Lead (``Leadership.on_elected``), then serve ``query.logs`` for the term (``logs_query``):
        its subscription is the term's, stopped with it."""
        await self.leadership.on_elected(revision)
        r = self.replica
        term, bus, store = r.term, r.bus, r.store
        if term is None or bus is None or store is None:
            return
        logs = LogsAnswerer(bus, lambda: r.book, store, epoch=term.epoch, operators=self.cfg.operators)
        sub = await bus.serve(QUERY_LOGS, LogsQuery, logs.answer)
        if r.term is term:
            term.subscriptions.append(sub)
        else:  # deposed while subscribing: a former leader answers nothing
            await sub.unsubscribe()

    async def stop(self) -> None:
        r = self.replica
        await self.eta.stop()
        if r.election is not None:
            await r.election.stop(resign=True)
            r.election = None
        if r.store is not None:
            await r.store.close()
            r.store = None

    # --- what tests, benchmarks and operators read -------------------------------------------
    @property
    def book(self) -> JobBook:
        """The leader's jobs and leases (a new, empty one after each deposition)."""
        return self.replica.book

    @property
    def inventory(self) -> Inventory:
        return self.replica.inventory

    @property
    def store(self) -> Store | None:
        return self.replica.store

    @property
    def bus(self) -> Bus | None:
        return self.replica.bus

    @property
    def election(self) -> LeaderElection | None:
        return self.replica.election

    @election.setter
    def election(self, election: LeaderElection | None) -> None:
        self.replica.election = election

    @property
    def _term(self) -> Term | None:
        return self.replica.term

    @property
    def epoch(self) -> int | None:
        """The epoch of the term this replica leads, or None."""
        term = self.replica.term
        return term.epoch if term is not None else None

    @property
    def is_leader(self) -> bool:
        return self.replica.is_leader

    @property
    def timings(self) -> RoundTimings:
        """The last round's timings."""
        return self.cycle.timings

    @property
    def snapshot(self) -> RoundSnapshot | None:
        """What the last round ranked."""
        return self.cycle.snapshot

    @property
    def rounds_run(self) -> int:
        return self.cycle.rounds_run

    def stats(self) -> dict[str, Any]:
        cycle = self.cycle
        return {
            "leader": self.is_leader,
            "epoch": self.epoch,
            "policy": self.policy.name,
            "rounds": cycle.rounds_run,
            "jobs": len(self.book.jobs),
            "leases": len(self.book.leases),
            "nodes": len(self.inventory),
            "plans_stale": cycle.plans_stale,
            "plans_timed_out": cycle.plans_timed_out,
            "plans_resynced": cycle.plans_resynced,
            "refused": self.replica.refusals.as_dict(),
            "placement_peer": cycle.snapshots.peer,
            "last_round": cycle.timings.as_dict(),
        }

    # --- rounds ------------------------------------------------------------------------------
    def request_round(self) -> None:
        """Run a round now (tests, operators)."""
        self.cycle.request_round()

    async def run_round(
        self, trigger: RoundTrigger = RoundTrigger.MANUAL, *, fill_only: bool = False
    ) -> ValidPlan | None:
        """One round now (``RoundCycle.run_round``); None if none ran or its plan never came."""
        return await self.cycle.run_round(trigger, fill_only=fill_only)

    def build_snapshot(self, now: float) -> tuple[Topology, ClusterState]:
        """The cluster as policies see it at ``now`` (``RoundCycle.build_snapshot``)."""
        return self.cycle.build_snapshot(now)

    async def execute(self, valid: ValidPlan, term: Term, timings: RoundTimings | None = None) -> None:
        """Execute a valid plan in ``term`` (``Execution.execute``)."""
        await self.execution.execute(valid, term, timings)

    # --- queries -----------------------------------------------------------------------------
    async def _on_query(self, query: JobsQuery) -> JobsReply:
        r = self.replica
        term = r.term
        if term is None or r.store is None:
            raise RuntimeError("not the leader; ask again (the leader answers query.jobs)")
        finished: list[JobRecord] = []
        if (
            query.include_finished
            or query.job_ids
            or any(JobStatus(s).is_final for s in query.statuses if s in JobStatus._value2member_map_)
        ):
            if query.job_ids:
                for job_id in query.job_ids:
                    record = await r.store.get_job(job_id)
                    if record is not None and record.status.is_final:
                        finished.append(record)
            else:
                finals = [s for s in JobStatus if s.is_final]
                finished = (await r.store.jobs_by_status(*finals))[-self.cfg.query_finished_limit :]
        context = self.cycle.waiting_context() if r.book.waiting_count() else None
        return answer(
            query, r.book, finished, r.clock.time(), term.epoch, context=context, operators=self.cfg.operators,
            etas=self.eta.table(), eta_on=self.cfg.eta,
        )  # fmt: skip

    async def _on_admission_query(self, query: AdmissionQuery) -> AdmissionReply:
        """What admission starts from (``queries.answer_admission``), once every fact stored up to
        ``query.through_seq`` is applied; a leader still behind after ``ADMISSION_WAIT_S`` says so."""
        r = self.replica
        term = r.term
        if term is None or r.bus is None:
            raise RuntimeError("not the leader; ask again (the leader answers query.admission)")
        if not await wait_applied_through(r.bus, query.through_seq, timeout_s=ADMISSION_WAIT_S):
            raise RuntimeError(f"facts up to stream sequence {query.through_seq} are not applied yet; ask again")
        if r.term is not term:
            raise RuntimeError("the term ended while answering; ask the next leader")
        return answer_admission(query, r.book, r.inventory, term.epoch)
