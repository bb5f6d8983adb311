"""Control-plane requests beyond DESIGN.md's table: two-phase stop propagation and job queries.

``lease.stop.<node>`` (:class:`LeaseStopAt`, request-reply, :class:`~schemas.leases.LeaseAck`):
the coordinator agent of a multi-node job, having fixed ``stop_at`` from rank 0's iteration, tells
every other node's agent to stop its ranks after that iteration (DESIGN, Leases and preemption,
phase one). It carries the revoke's epoch, so a deposed leader's revoke cannot be propagated.

``query.jobs`` (:class:`JobsQuery`, request-reply, :class:`JobsReply`): the scheduler leader answers
with its authoritative view of jobs; ``roundhouse jobs`` uses it, so it works against any deployment
reachable over NATS without access to the scheduler's database.

``query.admission`` (:class:`AdmissionQuery`, request-reply, :class:`AdmissionReply`): what the
admission service starts from (DESIGN, Trust and failure: "the store is the source of truth for
recovery"): the scheduler leader's unfinished jobs with their specs, in submission order (held ones
are offered again in that order), and the live nodes. Specs of every user travel here, so this is a
service role's subject (admission, operator), never a user's: a user reads jobs through
``query.jobs``, which carries no command, environment or working directory.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints

from schemas.base import MAX_TS, Command, Event, WireModel
from schemas.fields import (
    MAX_GPUS_PER_NODE,
    Counter,
    GpuIndex,
    GpuIndices,
    Host,
    Iteration,
    Reason,
    Seconds,
    ShortText,
    unique,
)
from schemas.ids import JobId, LeaseId, NodeId
from schemas.job import JobClass, JobName, JobSpec, ModelHint, UserName

__all__ = [
    "MAX_QUERY_JOBS",
    "MAX_QUERY_NODES",
    "AdmissionJob",
    "AdmissionNode",
    "AdmissionQuery",
    "AdmissionReply",
    "JobView",
    "JobsQuery",
    "JobsReply",
    "LeaseStopAt",
]

MAX_QUERY_JOBS: Final = 10_000
"""Most jobs in one reply; larger listings page with ``after`` (``after_seq`` for admission)."""
MAX_QUERY_NODES: Final = 10_000
"""Most nodes in one ``AdmissionReply``."""

_Status = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=r"^[a-z_]+$")]
_Time = Annotated[float, Field(ge=0, le=MAX_TS)]


class LeaseStopAt(Command):
    """Stop the lease's local ranks after iteration ``stop_at`` and report (``lease.stop.<node>``)."""

    lease_id: LeaseId
    job_id: JobId
    node_id: NodeId = Field(description="The node whose agent must stop its ranks.")
    stop_at: Iteration = Field(description="Every rank finishes this iteration, then stops.")
    grace_s: float = Field(ge=0, le=86_400, description="Time left of the revoke's grace period.")


class JobsQuery(Event):
    """Ask the scheduler for jobs: all unfinished ones by default, or the named ones.

    ``requester`` is the asking identity (``query.jobs.<requester>``, vouched for by the broker): a
    user sees only their own jobs, an operator everyone's."""

    requester: UserName = Field(
        default="default",
        description="The asking identity: the subject's last token (JobSpec's default user without authentication).",
    )
    job_ids: list[JobId] = Field(default_factory=list, max_length=MAX_QUERY_JOBS)
    statuses: list[_Status] = Field(default_factory=list, max_length=16, description="Filter; empty: any.")
    user: UserName | None = None
    include_finished: bool = False
    after: JobId | None = Field(default=None, description="Page: only jobs whose id sorts after this.")
    limit: int = Field(default=1000, ge=1, le=MAX_QUERY_JOBS)


class JobView(WireModel):
    """One job as ``roundhouse jobs`` shows it."""

    job_id: JobId
    name: JobName
    user: UserName
    job_class: JobClass
    status: _Status
    gpus: int = Field(ge=1, le=1024, description="GPUs requested.")
    model: ModelHint | None = Field(default=None, description="The spec's model hint (`roundhouse history` writes it).")
    placement: dict[NodeId, GpuIndices] = Field(default_factory=dict, max_length=1024)
    submit_time: _Time
    first_start_time: _Time | None = None
    finish_time: _Time | None = None
    attained_service_s: Seconds = Field(default=0.0, description="GPU-seconds held so far (GPUs x time, all runs).")
    runtime_s: Seconds = Field(default=0.0, description="Seconds it has held GPUs, over all its runs, up to now.")
    queue_position: int | None = Field(
        default=None, ge=1, le=MAX_QUERY_JOBS,
        description="A queued job's place among the waiting jobs in the last round's ranking (1: next); "
        "None for other jobs and for jobs that arrived after that round.",
    )  # fmt: skip
    iterations_done: Iteration = 0
    preemptions: Counter = 0
    reason: Reason | None = Field(
        default=None,
        description="Why it waits, was held, rejected or cancelled, or failed: a failure's exit code or "
        "signal, its node and the last lines of its output, or the launch error.",
    )
    exit_code: int | None = Field(default=None, ge=0, le=255, description="A failed job's non-zero exit code.")
    signal: int | None = Field(default=None, ge=1, le=128, description="The signal that killed a failed job.")
    eta_s: Seconds | None = Field(
        default=None,
        description="A queued job's expected start, in seconds from the reply (0: due now), from a forward "
        "simulation of the cluster under the policy in force; None for other jobs, or with eta_reason.",
    )
    eta_time: _Time | None = Field(default=None, description="The same expected start, as a Unix time.")
    eta_quality: Literal["durations", "guessed"] | None = Field(
        default=None,
        description="durations: every job it waits on declared expected_duration_s; guessed: it depends on a "
        "fallback duration (docs/scheduler.md, \"ETA\").",
    )
    eta_reason: Reason | None = Field(default=None, description="Why a queued job has no ETA.")


class JobsReply(WireModel):
    jobs: list[JobView] = Field(default_factory=list, max_length=MAX_QUERY_JOBS)
    truncated: bool = Field(default=False, description="More jobs match; ask again with ``after``.")
    epoch: Counter = Field(description="The answering leader's epoch.")
    refused: dict[JobId, Reason] = Field(
        default_factory=dict,
        max_length=MAX_QUERY_JOBS,
        description="Job ids the query named that the requester may not read, each with why "
        "(`permission denied: bob cannot read alice's job`): only the owner's name, never the job.",
    )


class AdmissionQuery(Event):
    """Ask the scheduler leader for the unfinished jobs and live nodes admission starts from.

    The leader answers only once it has applied every fact stored up to ``through_seq`` (the
    stream's last sequence when admission asked), so the reply and the facts admission then
    follows from ``through_seq + 1`` leave no gap; a leader still behind answers with an error
    (admission asks again)."""

    through_seq: Counter = Field(
        default=0, description="Stream sequence the answer must reflect every fact up to (0: any)."
    )
    after_seq: Counter | None = Field(
        default=None, description="Page: only jobs whose submission sequence is above this."
    )
    limit: int = Field(default=1000, ge=1, le=MAX_QUERY_JOBS)


class AdmissionJob(WireModel):
    """One unfinished job as the scheduler stores it: ``held`` (admission has not let it in, with
    or without a ``job.held`` verdict) or admitted (``queued``, ``running``)."""

    job_id: JobId
    spec: JobSpec
    status: _Status
    submit_time: _Time
    admit_time: _Time | None = None
    seq: Counter = Field(description="Submission sequence (stream order of job.arrived): held jobs' order.")


_NodeGpus = Annotated[list[GpuIndex], Field(max_length=MAX_GPUS_PER_NODE), AfterValidator(unique)]


class AdmissionNode(WireModel):
    """A live node as the scheduler knows it (its inventory in the store, liveness in memory)."""

    node_id: NodeId
    incarnation: uuid.UUID = Field(description="The agent incarnation whose heartbeats keep it live.")
    hostname: Host
    gpus: _NodeGpus = Field(default_factory=list, description="Local GPU indices.")
    gpu_type: ShortText = "generic"
    cpus: float = Field(default=32.0, gt=0, le=4096)
    memory_gb: float = Field(default=256.0, gt=0, le=2**20)
    draining: bool = False


class AdmissionReply(WireModel):
    """Unfinished jobs in submission order (one page), and, on the first page, the live nodes."""

    jobs: list[AdmissionJob] = Field(default_factory=list, max_length=MAX_QUERY_JOBS)
    nodes: list[AdmissionNode] = Field(default_factory=list, max_length=MAX_QUERY_NODES)
    truncated: bool = Field(default=False, description="More jobs follow; ask again with ``after_seq``.")
    epoch: Counter = Field(description="The answering leader's epoch.")
