"""Scheduling rounds: the scheduler's ranking and the placement service's plan for it.

Round *N* goes scheduler -> placement as :class:`ScheduleRound` (ranked jobs, elastic GPU targets,
jobs to terminate, the ``state_version`` they were ranked on, and the snapshot itself); placement
answers with :class:`PlacementPlan` for the same round and version. The scheduler applies a plan only
if its round, version and epoch are still current, so a late or duplicated plan is harmless.

**The round carries its snapshot** (:class:`RoundSnapshot`): the jobs and nodes the ranking used, with
every field a policy reads, so placement decides on exactly the state the ranking (and the simulator)
saw and keeps no job view of its own. A snapshot is *full*, or a *delta* against the version that the
placement instance it is addressed to (``to``) acknowledged with its last plan: jobs added or changed,
jobs gone, and the nodes only when they changed. An instance that does not hold the delta's base
answers ``resync`` and the scheduler sends the round again in full. A running job's attained service
and executed time are sent as the values its run began with (``service0``, ``executed0``) and are
advanced to the round's ``now`` on both sides by the same function, so a running job is re-sent only
when something other than the clock changed. Specs are sent without ``command``, ``env`` and
``workdir`` (no policy reads them; secrets stay off this subject) and only once per base.

Both travel on core NATS, not JetStream: a round is only meaningful against the state version it
was computed on, so replaying an old one after a restart would act on stale state; the scheduler
simply runs another round when a plan does not come back in time.

A plan names GPUs per node (``node_id`` + local indices) rather than by a global GPU number: global
ids are a dense numbering private to each process's ``ClusterState`` and need not agree between the
scheduler and placement, while (node, local index) is what NVML, the lease and the agent use.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from schemas.base import Command, Event, WireModel
from schemas.fields import (
    MAX_GPUS_PER_NODE,
    Counter,
    Epoch,
    GpuIndex,
    GpuIndices,
    Iteration,
    PolicyName,
    Reason,
    ShortText,
    unique,
)
from schemas.ids import InstanceId, JobId, NodeId
from schemas.job import MAX_GPUS_PER_JOB, GpuTypeName, JobClass, JobName, UserName

UNAVAILABLE_GPUS: Final = "(unavailable)"
"""The ``held`` key of a draining node's free GPUs: not a valid job id, so it can never name a job."""

__all__ = [
    "MAX_LOSS_HISTORY",
    "MAX_ROUND_JOBS",
    "MAX_ROUND_NODES",
    "UNAVAILABLE_GPUS",
    "GpuPairLink",
    "NodeGpus",
    "PlacementPlan",
    "PolicySpec",
    "RoundSnapshot",
    "RoundTrigger",
    "ScheduleRound",
    "SnapshotJob",
    "SnapshotNode",
]

MAX_ROUND_JOBS: Final = 50_000
"""Bound on jobs named in one round or plan. NATS's ``max_payload`` (1 MiB by default) binds
first: with uuid-sized ids about 25,000 ranked jobs fit; raise it in the server config for more."""

MAX_ROUND_NODES: Final = 100_000
MAX_LOSS_HISTORY: Final = 512
"""Bound on a job's (time, loss) samples in a snapshot (the scheduler keeps at most this many)."""

_JobIds = Annotated[list[JobId], Field(max_length=MAX_ROUND_JOBS), AfterValidator(unique)]
_Time = Annotated[float, Field(ge=-(10**10), le=10**10)]
"""A time on the scheduler's clock (the simulator's virtual clock may start at 0)."""
_Amount = Annotated[float, Field(ge=0, le=10**15)]
_Terminate = Annotated[dict[JobId, Reason], Field(max_length=MAX_ROUND_JOBS)]


class RoundTrigger(enum.StrEnum):
    """What started a round; a policy declares which it reacts to (FitGpp: arrival; Tiresias: timer)."""

    TIMER = "timer"
    ARRIVAL = "arrival"
    COMPLETION = "completion"
    NODE_CHANGE = "node_change"
    MANUAL = "manual"


class NodeGpus(WireModel):
    """GPUs on one node."""

    node_id: NodeId
    gpus: GpuIndices


def _distinct_nodes(parts: list[NodeGpus]) -> list[NodeGpus]:
    unique([part.node_id for part in parts])
    return parts


_Assignment = Annotated[list[NodeGpus], Field(min_length=1, max_length=1024), AfterValidator(_distinct_nodes)]


def _omit(default: object) -> Any:
    """``exclude_if`` for a field that is left out of the JSON when it has its default: a full
    snapshot of 20,000 jobs is then a third of the size, and the decoder fills the default back."""
    return lambda value: value == default


def _field(default: object, **constraints: Any) -> Any:
    return Field(default=default, exclude_if=_omit(default), **constraints)


class PolicySpec(WireModel):
    """A job spec as a round carries it: the fields policies read (``schemas.job.JobSpec``'s, with
    its constraints), without the argv, the environment (it may hold secrets) and the working
    directory. Fields at their default are left out of the JSON."""

    name: JobName
    user: UserName = _field("default")
    gpus: int = _field(1, ge=1, le=MAX_GPUS_PER_JOB)
    max_gpus: int | None = _field(None, ge=1, le=MAX_GPUS_PER_JOB)
    cpus: float = _field(1.0, gt=0, le=1024)
    memory_gb: float = _field(4.0, gt=0, le=16384)
    job_class: JobClass = _field(JobClass.BE)
    priority: int = _field(0, ge=-1000, le=1000)
    grace_period_s: float = _field(30.0, ge=0, le=86_400)
    max_preemptions: int | None = _field(None, ge=0, le=1_000_000)
    model: ShortText | None = _field(None)
    gpu_throughputs: dict[GpuTypeName, Annotated[float, Field(gt=0, le=1e6)]] | None = _field(None, max_length=32)
    expected_iterations: int | None = _field(None, ge=1, le=10**12)
    expected_duration_s: float | None = _field(None, gt=0, le=10**9)
    loss_target: float | None = _field(None, ge=-1e12, le=1e12)


class GpuPairLink(WireModel):
    """The bandwidth between two local GPUs of a node (``services.core.state.Node.link_bandwidth_gbps``)."""

    a: GpuIndex
    b: GpuIndex
    gbps: float = Field(ge=0, le=100_000, description="Gb/s, one direction.")

    @field_validator("b")
    @classmethod
    def _two_gpus(cls, b: int, info: ValidationInfo) -> int:
        if b == info.data.get("a"):
            raise ValueError("a link joins two different GPUs")
        return b


_MAX_PAIRS: Final = MAX_GPUS_PER_NODE * (MAX_GPUS_PER_NODE - 1) // 2


class SnapshotNode(WireModel):
    """A live node as policies see it (``services.core.state.Node``), in cluster order."""

    node_id: NodeId
    gpus: GpuIndices = Field(description="Local GPU indices, in the order global ids are numbered.")
    gpu_type: ShortText = "generic"
    cpus: float = Field(default=32.0, gt=0, le=1_000_000)
    memory_gb: float = Field(default=256.0, gt=0, le=10**9)
    links: list[GpuPairLink] = _field([], max_length=_MAX_PAIRS)
    """Known GPU-pair bandwidths (each pair once), from the node's register; empty: none known."""
    network_gbps: float | None = _field(None, gt=0, le=100_000)
    """The node's uplink from its register; None: not reported (``Node``'s default applies)."""

    @field_validator("links")
    @classmethod
    def _links_join_own_gpus_once(cls, links: list[GpuPairLink], info: ValidationInfo) -> list[GpuPairLink]:
        # The replica keys bandwidths by (a, b) and (b, a): a second entry for a pair would silently
        # replace the first, and a link to a GPU the node lacks would be a fact about nothing.
        gpus = info.data.get("gpus")
        if gpus is not None:
            own = set(gpus)
            for link in links:
                if link.a not in own or link.b not in own:
                    raise ValueError(f"link {link.a}-{link.b} names a GPU the node does not list")
        unique([(min(link.a, link.b), max(link.a, link.b)) for link in links])
        return links


class SnapshotJob(WireModel):
    """One admitted, unfinished job as policies see it (``services.core.state.JobState``); fields at
    their default are left out of the JSON."""

    job_id: JobId
    spec: PolicySpec | None = _field(None, description="Omitted when the base has the job (specs never change).")
    submit_time: _Time
    seq: Counter
    running: bool = _field(False)
    gpus: list[NodeGpus] = Field(
        default_factory=list, max_length=1024, exclude_if=lambda v: not v, description="Held GPUs, if running."
    )
    admit_time: _Time | None = _field(None)
    first_start_time: _Time | None = _field(None)
    last_start_time: _Time | None = _field(None)
    resumed_at: _Time | None = _field(None)
    last_preempt_time: _Time | None = _field(None)
    queued_since: _Time | None = _field(None)
    longest_wait_s: _Amount = _field(0.0)
    service0: _Amount = _field(
        0.0, description="Attained service; for a running job, what its current run began with."
    )
    executed0: _Amount = _field(0.0, description="Executed seconds; for a running job, at its run's start.")
    iterations_done: Iteration = _field(0)
    preemptions: Counter = _field(0)
    loss: float | None = _field(None, ge=-1e12, le=1e12)
    loss_history: list[tuple[_Time, Annotated[float, Field(ge=-1e12, le=1e12)]]] = Field(
        default_factory=list, max_length=MAX_LOSS_HISTORY, exclude_if=lambda v: not v
    )
    iteration_time_s: _Amount | None = _field(None)
    grad_noise_scale: float | None = _field(None, ge=0, le=1e12)
    """The job's latest reported gradient noise scale (``JobMetrics.grad_noise_scale``): Pollux ranks by it."""
    batch_size: int | None = _field(None, ge=1, le=2**31)
    """The total batch size it reported beside it."""


class RoundSnapshot(WireModel):
    """The state a round was ranked on: full, or a delta against the addressed instance's base."""

    version: Counter = Field(description="This snapshot's version (the scheduler's state version).")
    base: Counter | None = Field(default=None, description="None: full; else the version this delta applies to.")
    now: _Time = Field(description="The clock the ranking used; running jobs' progress is advanced to it.")
    nodes: list[SnapshotNode] | None = Field(
        default=None, max_length=MAX_ROUND_NODES, description="Live nodes; omitted in a delta when unchanged."
    )
    jobs: list[SnapshotJob] = Field(default_factory=list, max_length=MAX_ROUND_JOBS)
    removed: _JobIds = Field(default_factory=list, description="Jobs of the base that are gone (delta only).")
    held: dict[JobId | Literal["(unavailable)"], _Assignment] = Field(
        default_factory=dict,
        max_length=MAX_ROUND_JOBS,
        description="GPUs held by leases of jobs not in the round (being revoked or ending): taken, never "
        "placed. Sent in full every round. The key `(unavailable)` (UNAVAILABLE_GPUS, never a job id) "
        "holds the free GPUs of draining nodes.",
    )


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
    fill_only: bool = Field(
        default=False, description="A fill round: only launches of waiting jobs onto free GPUs (core/fill.py)."
    )
    to: InstanceId = Field(
        default="any",
        description="The placement instance this round is for (a delta against its snapshot), or 'any' (a full "
        "snapshot, for the queue group).",
    )
    snapshot: RoundSnapshot | None = Field(
        default=None, description="The jobs and nodes ranked; a round without one is refused by placement."
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
    instance: InstanceId | None = Field(
        default=None, description="The placement instance that answered; it now holds the round's snapshot."
    )
    resync: bool = Field(
        default=False, description="The instance does not hold the delta's base: send the round in full."
    )
    error: Reason | None = Field(
        default=None, description="Why the round could not be placed (e.g. it ranks a job its snapshot lacks)."
    )

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
