"""Control-plane requests beyond DESIGN.md's table: two-phase stop propagation and job queries.

``lease.stop.<node>`` (:class:`LeaseStopAt`, request-reply, :class:`~schemas.leases.LeaseAck`):
the coordinator agent of a multi-node job, having fixed ``stop_at`` from rank 0's iteration, tells
every other node's agent to stop its ranks after that iteration (DESIGN, Leases and preemption,
phase one). It carries the revoke's epoch, so a deposed leader's revoke cannot be propagated.

``query.jobs`` (:class:`JobsQuery`, request-reply, :class:`JobsReply`): the scheduler leader answers
with its authoritative view of jobs; ``roundhouse jobs`` uses it, so it works against any deployment
reachable over NATS without access to the scheduler's database.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, StringConstraints

from schemas.base import MAX_TS, Command, Event, WireModel
from schemas.fields import Counter, GpuIndices, Iteration, Reason, Seconds
from schemas.ids import JobId, LeaseId, NodeId
from schemas.job import JobClass, JobName, UserName

__all__ = ["MAX_QUERY_JOBS", "JobView", "JobsQuery", "JobsReply", "LeaseStopAt"]

MAX_QUERY_JOBS: Final = 10_000
"""Most jobs in one reply; larger listings page with ``after``."""

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
    """Ask the scheduler for jobs: all unfinished ones by default, or the named ones."""

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
    placement: dict[NodeId, GpuIndices] = Field(default_factory=dict, max_length=1024)
    submit_time: _Time
    first_start_time: _Time | None = None
    finish_time: _Time | None = None
    attained_service_s: Seconds = 0.0
    iterations_done: Iteration = 0
    preemptions: Counter = 0
    reason: Reason | None = Field(default=None, description="Why it was held, rejected or failed.")


class JobsReply(WireModel):
    jobs: list[JobView] = Field(default_factory=list, max_length=MAX_QUERY_JOBS)
    truncated: bool = Field(default=False, description="More jobs match; ask again with ``after``.")
    epoch: Counter = Field(description="The answering leader's epoch.")
