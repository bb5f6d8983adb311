"""The placement service: answers each ``schedule.round`` with a ``placement.plan``.

It keeps a view of the cluster built from facts on the bus (``view.py``): on start it replays the
lifecycle stream (``services.runtime.replay``), then follows it; heartbeats arrive on core NATS.
Each round (queue group ``placement``, so replicas share the rounds) runs the configured placement
policy (``--policy``, a name in ``services.core.registry.PLACEMENT``; options from
``policy_options``) on that view with the round's ranking, turns the target allocation into a
diff (``services.core.round.diff_plan``) and publishes it with GPUs named per node.

Jobs the round ranks whose spec this replica has not seen yet are waited for, up to
``spec_wait_s``: the scheduler can rank a job a few tens of milliseconds after admission accepted it,
before this replica's view has read its ``job.arrived`` (seen live: a fill round for a just-submitted
job found no spec, and the job then waited for the next tick). Jobs still unknown after that are left
out of the plan (counted in ``unknown_jobs``); the scheduler applies only the still-valid parts of a
plan and runs another round, so a lagging view costs at most a round, never a wrong grant
(docs/control-plane.md, A round).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, ClassVar

import nats.errors
from nats.aio.subscription import Subscription
from pydantic import Field, model_validator

from schemas.base import Event
from schemas.nodes import NodeHeartbeat
from schemas.rounds import NodeGpus, PlacementPlan, ScheduleRound
from schemas.subjects import (
    JOB_ARRIVED,
    JOB_CANCEL,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_REJECTED,
    JOB_STARTED,
    JOB_SUSPENDED,
    NODE_HEARTBEAT,
    NODE_REGISTER,
    PLACEMENT_PLAN,
    SCHEDULE_ROUND,
)
from services.core.decisions import Ranking
from services.core.protocols import PlacementPolicy
from services.core.registry import PLACEMENT
from services.core.round import diff_plan
from services.core.state import JobState
from services.placement.view import ClusterView
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.replay import ReaderStats, StreamFollower, replay
from services.runtime.service import RoundhouseService

log = logging.getLogger("roundhouse.placement")

VIEW_SUBJECTS: tuple[str, ...] = (
    NODE_REGISTER,
    JOB_ARRIVED,
    JOB_STARTED,
    JOB_SUSPENDED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_REJECTED,
    JOB_CANCEL,
)
"""The stored facts the view is built from (heartbeats come on core NATS)."""

QUEUE_GROUP = "placement"


class PlacementConfig(ServiceConfig):
    """Settings of one placement replica (``roundhouse service placement --policy consolidated``)."""

    policy: str = Field(default="consolidated", description="Placement policy (a name in PLACEMENT).")
    lease_ttl_s: float = Field(
        default=30.0, gt=0, le=86_400, description="A node silent this long is dead (as the scheduler's)."
    )
    sweep_interval_s: float = Field(default=1.0, gt=0, le=3600, description="How often liveness is checked.")
    spec_wait_s: float = Field(
        default=1.0, ge=0, le=60, description="A round ranking jobs this view has not seen waits this long for them."
    )

    @model_validator(mode="after")
    def _policy_builds(self) -> PlacementConfig:
        # Fail at configuration time, with the valid names, rather than in the service's start.
        PLACEMENT.check(self.policy, self.policy_options, label="policy_options")
        return self


class PlacementService(RoundhouseService):
    """Places each round's ranking on the cluster view and publishes the plan."""

    kind: ClassVar[str] = "placement"
    description: ClassVar[str] = "Roundhouse placement: a plan (GPUs per node) for each scheduling round"
    config_model: ClassVar[type[ServiceConfig]] = PlacementConfig

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        if not isinstance(config, PlacementConfig):
            raise TypeError(f"PlacementService needs a PlacementConfig, not {type(config).__name__}")
        self.settings = config
        name = self.settings.policy
        self.policy: PlacementPolicy = PLACEMENT.create(name, **self.settings.policy_options)
        self.view = ClusterView(lease_ttl_s=self.settings.lease_ttl_s)
        self.replay_stats = ReaderStats()
        self.rounds = 0
        self.plans = 0
        self.unknown_jobs = 0
        self.round_errors = 0
        self.last_round_ms = 0.0
        self.ready = asyncio.Event()
        """Set once the view is rebuilt and rounds are being answered."""
        self._bus: Bus | None = None
        self._follower: StreamFollower | None = None
        self._subs: list[Subscription] = []
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        began = time.perf_counter()
        last = await replay(bus, VIEW_SUBJECTS, self._apply, stats=self.replay_stats)
        log.info(
            "placement view rebuilt from %d facts in %.0f ms: %d nodes, %d jobs, %d leases",
            self.replay_stats.handled, (time.perf_counter() - began) * 1000,
            len(self.view.inventory.nodes), len(self.view.jobs), len(self.view.leases),
        )  # fmt: skip
        self._follower = StreamFollower(bus, VIEW_SUBJECTS, self._apply, start_seq=last + 1, name="placement-view")
        await self._follower.start()
        self._subs.append(await bus.subscribe(NODE_HEARTBEAT, NodeHeartbeat, self._apply))
        self._subs.append(await bus.subscribe(SCHEDULE_ROUND, ScheduleRound, self._on_round, queue=QUEUE_GROUP))
        self._sweeper = asyncio.create_task(self._sweep(), name="placement-sweep")
        self.ready.set()

    async def _apply(self, event: Event) -> None:
        self.view.apply(event, time.monotonic())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            died = self.view.sweep(time.monotonic())
            if died:
                log.warning("nodes silent for over %.0f s, left out of placement: %s",
                            self.settings.lease_ttl_s, ", ".join(died))  # fmt: skip

    async def _on_round(self, round_: ScheduleRound) -> None:
        self.rounds += 1
        await self._catch_up(round_)
        try:
            plan = self.place(round_, now=time.time())
        except Exception:
            self.round_errors += 1
            raise  # the bus logs it; the scheduler times out and runs another round
        assert self._bus is not None
        await self._bus.publish(PLACEMENT_PLAN, plan)
        self.plans += 1

    async def _catch_up(self, round_: ScheduleRound) -> None:
        """Wait (at most ``spec_wait_s``) until the view knows every job ``round_`` ranks."""
        missing = [job_id for job_id in round_.ranked if job_id not in self.view.jobs]
        deadline = time.monotonic() + self.settings.spec_wait_s
        while missing and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            missing = [job_id for job_id in missing if job_id not in self.view.jobs]

    def place(self, round_: ScheduleRound, *, now: float) -> PlacementPlan:
        """The plan for ``round_`` on the current view (pure but for the view's lazy rebuild)."""
        began = time.perf_counter()
        cluster = self.view.cluster()
        known = self.view.jobs
        jobs: dict[str, JobState] = {}
        for job_id in round_.ranked:
            job = known.get(job_id)
            if job is not None:
                jobs[job_id] = job
        missing = len(round_.ranked) - len(jobs)
        if missing:
            self.unknown_jobs += missing
            log.warning("round %d ranks %d job(s) placement has no spec for; they wait a round",
                        round_.round, missing)  # fmt: skip
        targets = {j: n for j, n in round_.gpu_targets.items() if j in jobs}
        ranking = Ranking(order=tuple(jobs), terminate=dict(round_.terminate), gpu_targets=targets,
                          preempt=round_.preempt)
        target = self.policy.place(ranking, jobs, cluster, now)
        diff = diff_plan(target, ranking, jobs)
        launch = {
            job_id: [NodeGpus(node_id=node, gpus=local) for node, local in self.view.node_gpus(gpus).items()]
            for job_id, gpus in diff.launch.items()
            if gpus
        }
        plan = PlacementPlan(
            round=round_.round,
            state_version=round_.state_version,
            epoch=round_.epoch,
            policy=self.policy.name,
            launch=launch,
            suspend=list(diff.suspend),
            terminate=dict(diff.terminate),
        )
        self.last_round_ms = (time.perf_counter() - began) * 1000
        return plan

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if self._follower is not None:
            await self._follower.stop()

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "rounds": self.rounds,
            "plans": self.plans,
            "round_errors": self.round_errors,
            "unknown_jobs": self.unknown_jobs,
            "last_round_ms": round(self.last_round_ms, 3),
            "nodes_live": len(self.view.inventory.live_nodes()),
            "jobs": len(self.view.jobs),
            "leases": len(self.view.leases),
            "replayed": self.replay_stats.handled,
            "followed": self._follower.stats.handled if self._follower else 0,
        }
