"""Scheduling rounds: the scheduler's ranking and the placement service's plan for it.

Round *N* goes scheduler -> placement as :class:`ScheduleRound` (ranked jobs, elastic GPU targets,
jobs to terminate, and the ``state_version`` they were ranked on); placement answers with
:class:`PlacementPlan` for the same round and version. The scheduler applies a plan only if its
round, version and epoch are still current, so a late or duplicated plan is harmless.

Both travel on core NATS, not JetStream: a round is only meaningful against the state version it
was computed on, so replaying an old one after a restart would act on stale state; the scheduler
simply runs another round when a plan does not come back in time.

A plan names GPUs per node (``node_id`` + local indices) rather than by a global GPU number: global
ids are a dense numbering private to each process's ``ClusterState`` and need not agree between the
scheduler and placement, while (node, local index) is what NVML, the lease and the agent use.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

from pydantic import AfterValidator, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from schemas.base import Command, Event, WireModel
from schemas.fields import Counter, Epoch, GpuIndices, PolicyName, Reason, unique
from schemas.ids import JobId, NodeId
from schemas.job import MAX_GPUS_PER_JOB

__all__ = [
    "MAX_ROUND_JOBS",
    "NodeGpus",
    "PlacementPlan",
    "RoundTrigger",
    "ScheduleRound",
]

MAX_ROUND_JOBS: Final = 50_000
"""Bound on jobs named in one round or plan. NATS's ``max_payload`` (1 MiB by default) binds
first: with uuid-sized ids about 25,000 ranked jobs fit; raise it in the server config for more."""

_JobIds = Annotated[list[JobId], Field(max_length=MAX_ROUND_JOBS), AfterValidator(unique)]
_Terminate = Annotated[dict[JobId, Reason], Field(max_length=MAX_ROUND_JOBS)]


class RoundTrigger(enum.StrEnum):
    """What started a round; a policy declares which it reacts to (FitGpp: arrival; Tiresias: timer)."""

    TIMER = "timer"
    ARRIVAL = "arrival"
    COMPLETION = "completion"
    NODE_CHANGE = "node_change"
    MANUAL = "manual"


class ScheduleRound(Command):
    """Round ``round``: the scheduling policy's ranking over state version ``state_version``."""

    round: Counter = Field(description="Round number; increases by one per round of this epoch.")
    state_version: Counter = Field(description="Version of the scheduler's state the ranking used.")
    trigger: RoundTrigger = RoundTrigger.TIMER
    policy: PolicyName | None = Field(default=None, description="Scheduling policy that ranked.")
    ranked: _JobIds = Field(description="Job ids, most deserving first.")
    gpu_targets: dict[JobId, Annotated[int, Field(ge=1, le=MAX_GPUS_PER_JOB)]] = Field(
        default_factory=dict,
        max_length=MAX_ROUND_JOBS,
        description="Elastic policies' GPU count for a ranked job, when not the spec's.",
    )
    terminate: _Terminate = Field(
        default_factory=dict, description="Jobs to end now, with the reason (e.g. converged, Blox §5.3)."
    )
    preempt: bool = Field(
        default=True,
        description="Whether placement may suspend running jobs for higher-ranked ones (False: FIFO-like "
        "policies only fill free GPUs).",
    )

    @field_validator("gpu_targets")
    @classmethod
    def _targets_are_ranked(cls, targets: dict[str, int], info: ValidationInfo) -> dict[str, int]:
        ranked = info.data.get("ranked")
        if ranked is not None and targets:
            known = set(ranked)
            for job_id in targets:
                if job_id not in known:
                    raise PydanticCustomError(
                        "target_not_ranked",
                        "gpu_targets names '{job}', which is not in ranked",
                        {"job": job_id},
                    )
        return targets


class NodeGpus(WireModel):
    """GPUs on one node."""

    node_id: NodeId
    gpus: GpuIndices


def _distinct_nodes(parts: list[NodeGpus]) -> list[NodeGpus]:
    unique([part.node_id for part in parts])
    return parts


_Assignment = Annotated[list[NodeGpus], Field(min_length=1, max_length=1024), AfterValidator(_distinct_nodes)]


class PlacementPlan(Event):
    """Placement's answer to round ``round``: what to suspend first, then what to launch where.

    A job that moves (migration) or changes size appears in both ``suspend`` and ``launch``.
    """

    round: Counter
    state_version: Counter = Field(description="The state version of the round this plan answers.")
    epoch: Epoch = Field(description="The epoch of the round this plan answers.")
    policy: PolicyName | None = Field(default=None, description="Placement policy that placed.")
    launch: dict[JobId, _Assignment] = Field(default_factory=dict, max_length=MAX_ROUND_JOBS)
    suspend: _JobIds = Field(default_factory=list)
    terminate: _Terminate = Field(default_factory=dict)

    @field_validator("terminate")
    @classmethod
    def _terminated_not_launched(cls, terminate: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        launch = info.data.get("launch")
        if launch:
            for job_id in terminate:
                if job_id in launch:
                    raise PydanticCustomError(
                        "terminated_job_launched", "'{job}' is both launched and terminated", {"job": job_id}
                    )
        return terminate

    def gpu_count(self, job_id: str) -> int:
        """GPUs the plan gives ``job_id`` over all nodes (0 if it is not launched)."""
        return sum(len(part.gpus) for part in self.launch.get(job_id, ()))

    @property
    def is_empty(self) -> bool:
        return not (self.launch or self.suspend or self.terminate)
