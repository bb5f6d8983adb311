"""The placement service: answers each ``schedule.round`` with a ``placement.plan``.

It keeps no view of its own. Every round carries the snapshot the scheduler ranked on
(``schemas.rounds``, "The round carries its snapshot"): the service applies it to the snapshot it
holds (``services.core.snapshot.SnapshotReplica``), runs the placement half of the round
(``services.core.round.place_step``, the function the simulator runs) with the configured policy
(``--policy``, a name in ``services.core.registry.PLACEMENT``; options from ``policy_options``), and
publishes the plan with GPUs named per node. So a live round and a simulated round on the same
snapshot give the same plan, and a restarted or new instance needs nothing but the next round.

Replicas share the rounds that carry a full snapshot (queue group ``placement`` on
``schedule.round.any``); the instance that answered one then gets the next rounds as deltas on its own
subject (``schedule.round.<instance>``). A delta whose base this instance does not hold is answered
with ``resync`` and the scheduler sends the round in full. A round that names a job its snapshot
lacks, or is otherwise wrong, is an error of that round, answered with the reason at once: nothing
waits.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Any, ClassVar

import nats.errors
from nats.aio.subscription import Subscription
from pydantic import Field, model_validator

from schemas.rounds import NodeGpus, PlacementPlan, ScheduleRound
from schemas.subjects import ANY_PLACEMENT, PLACEMENT_PLAN, schedule_round
from services.core.decisions import Ranking
from services.core.protocols import PlacementPolicy
from services.core.registry import PLACEMENT
from services.core.round import place_step
from services.core.snapshot import BaseMismatchError, SnapshotReplica, UnknownSnapshotGpuError
from services.core.state import ClusterState
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.service import RoundhouseService

log = logging.getLogger("roundhouse.placement")

QUEUE_GROUP = "placement"


class RoundError(ValueError):
    """A round that cannot be placed as sent (it names jobs its snapshot lacks, has no snapshot, ...)."""


class PlacementConfig(ServiceConfig):
    """Settings of one placement replica (``roundhouse service placement --policy consolidated``)."""

    policy: str = Field(default="consolidated", description="Placement policy (a name in PLACEMENT).")

    @model_validator(mode="after")
    def _policy_builds(self) -> PlacementConfig:
        # Fail at configuration time, with the valid names, rather than in the service's start.
        PLACEMENT.check(self.policy, self.policy_options, label="policy_options")
        return self


class PlacementService(RoundhouseService):
    """Places each round's ranking on the round's own snapshot and publishes the plan."""

    kind: ClassVar[str] = "placement"
    description: ClassVar[str] = "Roundhouse placement: a plan (GPUs per node) for each scheduling round"
    config_model: ClassVar[type[ServiceConfig]] = PlacementConfig

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        if not isinstance(config, PlacementConfig):
            raise TypeError(f"PlacementService needs a PlacementConfig, not {type(config).__name__}")
        self.settings = config
        self.policy: PlacementPolicy = PLACEMENT.create(self.settings.policy, **self.settings.policy_options)
        self.replica = SnapshotReplica()
        self.replica_id = uuid.uuid4().hex
        """This instance's subject token for deltas (``schedule.round.<replica_id>``): unique per
        process, so a restarted instance never receives a delta against a base it lost."""
        self.rounds = 0
        self.plans = 0
        self.resyncs = 0
        self.round_errors = 0
        self.last_round_ms = 0.0
        self._bus: Bus | None = None
        self._subs: list[Subscription] = []

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._subs.append(
            await bus.subscribe(schedule_round(ANY_PLACEMENT), ScheduleRound, self._on_round, queue=QUEUE_GROUP)
        )
        self._subs.append(await bus.subscribe(schedule_round(self.replica_id), ScheduleRound, self._on_round))

    async def _on_round(self, round_: ScheduleRound) -> None:
        self.rounds += 1
        try:
            plan = self.place(round_)
        except BaseMismatchError as exc:
            self.resyncs += 1
            log.info("round %d: %s; asking for the full snapshot", round_.round, exc)
            plan = self._answer(round_, resync=True)
        except (RoundError, UnknownSnapshotGpuError) as exc:
            self.round_errors += 1
            log.warning("round %d refused: %s", round_.round, exc)
            plan = self._answer(round_, error=str(exc)[:1000])
        assert self._bus is not None
        await self._bus.publish(PLACEMENT_PLAN, plan)
        self.plans += 1

    def _answer(self, round_: ScheduleRound, **fields: Any) -> PlacementPlan:
        return PlacementPlan(
            round=round_.round, state_version=round_.state_version, epoch=round_.epoch, policy=self.policy.name,
            instance=self.replica_id, **fields,
        )  # fmt: skip

    def place(self, round_: ScheduleRound) -> PlacementPlan:
        """The plan for ``round_`` on its snapshot (pure but for the snapshot this instance holds)."""
        began = time.perf_counter()
        snapshot = round_.snapshot
        if snapshot is None:
            raise RoundError("the round carries no snapshot (a scheduler older than this placement service?)")
        jobs, cluster = self.replica.apply(snapshot)
        for names, what in ((round_.ranked, "ranks"), (round_.terminate, "terminates"),
                            (round_.gpu_targets, "sizes")):  # fmt: skip
            unknown = [job_id for job_id in names if job_id not in jobs]
            if unknown:
                raise RoundError(f"the round {what} {len(unknown)} job(s) its snapshot lacks: {', '.join(unknown[:5])}")
        ranking = Ranking(
            order=tuple(round_.ranked), terminate=dict(round_.terminate), gpu_targets=dict(round_.gpu_targets),
            preempt=round_.preempt,
        )  # fmt: skip
        plan = place_step(self.policy, ranking, jobs, cluster, snapshot.now, fill_only=round_.fill_only)
        launch = {
            job_id: [NodeGpus(node_id=node, gpus=local) for node, local in _by_node(cluster, gpus).items()]
            for job_id, gpus in plan.launch.items()
            if gpus
        }
        answer = self._answer(round_, launch=launch, suspend=list(plan.suspend), terminate=dict(plan.terminate))
        self.last_round_ms = (time.perf_counter() - began) * 1000
        return answer

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "instance": self.replica_id,
            "rounds": self.rounds,
            "plans": self.plans,
            "resyncs": self.resyncs,
            "round_errors": self.round_errors,
            "last_round_ms": round(self.last_round_ms, 3),
            "snapshot_version": self.replica.version,
        }


def _by_node(cluster: ClusterState, gpu_ids: tuple[int, ...]) -> dict[str, list[int]]:
    """Global GPU ids as ``{node id: [local indices]}``, in node order."""
    by_node: dict[str, list[int]] = {}
    for g in sorted(gpu_ids):
        gpu = cluster.gpus[g]
        by_node.setdefault(gpu.node_id, []).append(gpu.local_index)
    return by_node
