"""What an operator reads and does to the cluster: nodes, drains, the control plane's status (issue 15).

``query.nodes.<requester>`` (:class:`NodesQuery`, request-reply, :class:`NodesReply`): the scheduler
leader's nodes: GPUs (total, used, free), the jobs on each, liveness (the last heartbeat's age,
silent or dead) and whether it drains. Users may ask, as Slurm's ``sinfo`` lets them; a user sees
the ids of their own jobs on a node and only a count of everyone else's.

``operator.drain.<requester>`` (:class:`DrainRequest`, request-reply, :class:`DrainReply`): drain a
node (it takes no new work; with ``now`` its running jobs are revoked through the normal two-phase
preemption, so they checkpoint and queue again) or undrain it. Only operators: the broker lets no
other role publish here, and the scheduler checks the requester (the subject's last token) besides.

``query.status.<requester>`` (:class:`StatusQuery`, request-reply, :class:`StatusReply`): the leader
and its epoch, each service's instances as the NATS services API reports them (with the policy and
options each runs), the last round's phase timings and the queue's depth.

The requester is the asking identity, vouched for by the broker through the subject's last token
(``schemas.subjects``), as for ``query.jobs``.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

from pydantic import Field, JsonValue, StringConstraints

from schemas.base import MAX_TS, Event, WireModel
from schemas.fields import MAX_GPUS_PER_NODE, Counter, Epoch, Host, Reason, Seconds, ShortText
from schemas.ids import JobId, NodeId
from schemas.job import UserName

__all__ = [
    "MAX_QUERY_NODES",
    "DrainReply",
    "DrainRequest",
    "InstanceView",
    "NodeState",
    "NodeView",
    "NodesQuery",
    "NodesReply",
    "QueueDepth",
    "RoundView",
    "ServiceView",
    "StatusQuery",
    "StatusReply",
]

MAX_QUERY_NODES: Final = 10_000
"""Most nodes in one :class:`NodesReply`."""
_MAX_JOBS_PER_NODE: Final = 1024
_MAX_INSTANCES: Final = 10_000
_MAX_OPTIONS: Final = 64

_Time = Annotated[float, Field(ge=0, le=MAX_TS)]
_GpuCount = Annotated[int, Field(ge=0, le=MAX_GPUS_PER_NODE)]
_Url = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=r"^[^\x00-\x1f\x7f]*$")]


class NodeState(enum.StrEnum):
    """One word for a node, as ``sinfo`` has them (first that applies, in this order)."""

    DOWN = "down"
    """Silent for the lease TTL: its jobs were queued again, its GPUs count for nothing."""
    SILENT = "silent"
    """Not heard from for a while (less than the TTL): no new work; its leases stand."""
    DRAINING = "draining"
    """Drained (by an operator, or its agent is leaving) and still running jobs."""
    DRAINED = "drained"
    """Drained and idle: safe to take down."""
    ALLOCATED = "allocated"
    """Every GPU held."""
    MIXED = "mixed"
    """Some GPUs held."""
    IDLE = "idle"
    """No GPU held."""


class NodesQuery(Event):
    """Ask the scheduler leader for its nodes (every registered one by default)."""

    requester: UserName = Field(
        default="default", description="The asking identity: the subject's last token (query.nodes.<requester>)."
    )
    node_ids: list[NodeId] = Field(default_factory=list, max_length=MAX_QUERY_NODES, description="Filter; empty: all.")


class NodeView(WireModel):
    """One node as ``roundhouse nodes`` shows it."""

    node_id: NodeId
    hostname: Host
    gpu_type: ShortText = "generic"
    state: NodeState
    gpus_total: _GpuCount
    gpus_used: _GpuCount = Field(description="GPUs held by leases (granted or being revoked).")
    gpus_free: _GpuCount = Field(description="GPUs no lease holds (offered to jobs only if the node takes work).")
    jobs: list[JobId] = Field(
        default_factory=list, max_length=_MAX_JOBS_PER_NODE,
        description="Jobs holding GPUs here that the requester may see (an operator: all).",
    )  # fmt: skip
    other_jobs: Counter = Field(default=0, description="Jobs here of other users, not named to a user.")
    live: bool = Field(description="False once silent for the lease TTL (its jobs were queued again).")
    silent: bool = Field(default=False, description="Not heard from within the silence limit: takes no new work.")
    heartbeat_age_s: Seconds | None = Field(
        default=None,
        description="Seconds since its last registration or heartbeat (since the leader took over, if none came "
        "since: a new leader does not know when a node last spoke).",
    )
    takes_work: bool = Field(description="Whether new work may be placed here now.")
    draining: bool = Field(default=False, description="Takes no new work: drained by an operator or leaving.")
    drained_by: UserName | None = Field(default=None, description="The operator who drained it (None: not drained).")
    drained_at: _Time | None = Field(default=None, description="When an operator drained it (epoch seconds).")
    drain_reason: Reason | None = Field(default=None, description="Why, as the operator said.")
    agent_draining: bool = Field(default=False, description="Its worker agent says it is leaving (shutting down).")


class NodesReply(WireModel):
    nodes: list[NodeView] = Field(default_factory=list, max_length=MAX_QUERY_NODES)
    epoch: Epoch = Field(description="The answering leader's epoch.")
    silent_after_s: Seconds = Field(default=0.0, description="A node not heard from for this long takes no new work.")
    down_after_s: Seconds = Field(default=0.0, description="A node not heard from for this long is down (lease TTL).")
    unknown: list[NodeId] = Field(
        default_factory=list, max_length=MAX_QUERY_NODES, description="Node ids the query named that no node has."
    )


class DrainRequest(Event):
    """Drain (``drain`` True) or undrain a node; operators only (module doc)."""

    requester: UserName = Field(
        default="default", description="The asking identity: the subject's last token (operator.drain.<requester>)."
    )
    node_id: NodeId
    drain: bool = Field(default=True, description="True: drain; False: take new work again.")
    now: bool = Field(default=False, description="With drain: also preempt its running jobs (checkpoint, queue again).")
    reason: Reason | None = Field(default=None, description="Why; shown by `roundhouse nodes`.")


class DrainReply(WireModel):
    node_id: NodeId
    draining: bool = Field(description="Whether an operator's drain holds the node now.")
    changed: bool = Field(description="False when the node already was so (nothing was written).")
    preempted: list[JobId] = Field(
        default_factory=list, max_length=_MAX_JOBS_PER_NODE, description="Jobs asked to checkpoint and stop (--now)."
    )
    epoch: Epoch = Field(description="The answering leader's epoch.")


class StatusQuery(Event):
    """Ask the scheduler leader for the control plane's status."""

    requester: UserName = Field(
        default="default", description="The asking identity: the subject's last token (query.status.<requester>)."
    )


class InstanceView(WireModel):
    """One running instance of a service, as the NATS services API (``$SRV.STATS``) reports it."""

    instance: ShortText = Field(description="The instance id Roundhouse gave it (its services-API id if none).")
    service_id: ShortText = Field(description="The NATS services API's id of the instance.")
    version: ShortText = "0.0.0"
    uptime_s: Seconds | None = None
    policy: ShortText | None = Field(default=None, description="The policy it runs (None: none, or not said).")
    policy_options: dict[ShortText, JsonValue] = Field(default_factory=dict, max_length=_MAX_OPTIONS)
    leader: bool = Field(default=False, description="The scheduler replica that leads (answered this query).")
    metrics_url: _Url | None = None


class ServiceView(WireModel):
    """One kind of service (``scheduler``, ``admission``, ``placement``, ``metrics``, ``worker``)."""

    kind: ShortText
    instances: list[InstanceView] = Field(default_factory=list, max_length=_MAX_INSTANCES)


class RoundView(WireModel):
    """The leader's last round."""

    number: Counter = Field(default=0, description="Its round number (0: none yet in this term).")
    rounds_run: Counter = Field(default=0, description="Rounds this leader ran in its term.")
    policy: ShortText | None = Field(default=None, description="The scheduling policy that ranked it.")
    phases_s: dict[ShortText, Seconds] = Field(
        default_factory=dict, max_length=32,
        description="Seconds per phase (snapshot, rank, encode, publish, placement, apply, ...; cpu: CPU seconds).",
    )  # fmt: skip
    launched: Counter = 0
    suspended: Counter = 0
    dropped: Counter = 0


class QueueDepth(WireModel):
    """Unfinished jobs by status, and the GPUs the queued ones ask for."""

    queued: Counter = 0
    held: Counter = 0
    running: Counter = 0
    queued_gpus: Counter = Field(default=0, description="GPUs the queued jobs need together.")


class StatusReply(WireModel):
    leader: ShortText = Field(description="The scheduler instance that leads (and answered).")
    epoch: Epoch = Field(description="Its leadership term, the fencing epoch of every command it sends.")
    services: list[ServiceView] = Field(default_factory=list, max_length=16)
    round: RoundView = Field(default_factory=RoundView)
    queue: QueueDepth = Field(default_factory=QueueDepth)
    nodes: Counter = Field(default=0, description="Registered nodes.")
    nodes_taking_work: Counter = Field(default=0, description="Nodes that take new work now.")
    gpus_total: Counter = Field(default=0, description="GPUs of live nodes.")
    gpus_used: Counter = Field(default=0, description="GPUs held by leases.")
