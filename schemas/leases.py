"""Leases: the scheduler's commands to a worker, and the worker's reply.

Leases are optimistic (after Blox §7): a :class:`LeaseGrant` holds until a :class:`LeaseRevoke`;
nobody renews per round. Both are :class:`~schemas.base.Command` s carrying the fencing ``epoch``
of the leader that issued them, and both are NATS request-reply on ``lease.grant.<node>`` /
``lease.revoke.<node>``: the agent answers with a :class:`LeaseAck` once it has recorded the
command (not once the job started or stopped: those are ``job.started`` / ``job.suspended``). The
scheduler retries a request that got no reply, with the same ``lease_id``, so an agent must treat a
repeated grant or revoke as a no-op and ack it again (``duplicate=True``).

A multi-node job gets one grant per node, all with the same ``lease_id``, each with its own
:class:`WorldInfo`. A revoke goes only to the coordinator (the node of rank 0), which runs the
two-phase stop (DESIGN, Leases and preemption) across the other nodes.
"""

from __future__ import annotations

import enum

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import Command, Event, WireModel
from schemas.fields import Counter, Epoch, GpuIndices, Host, Iteration, Message, Path, Reason
from schemas.ids import JobId, LeaseId, NodeId
from schemas.job import MAX_GPUS_PER_JOB, JobSpec

__all__ = [
    "LeaseAck",
    "LeaseAckError",
    "LeaseGrant",
    "LeaseRevoke",
    "RevokeReason",
    "WorldInfo",
]

MAX_NODES_PER_JOB = 1024


class WorldInfo(WireModel):
    """Where one node's processes sit in a multi-node job (torch.distributed's rendezvous)."""

    num_nodes: int = Field(ge=1, le=MAX_NODES_PER_JOB)
    node_rank: int = Field(ge=0, lt=MAX_NODES_PER_JOB, description="0 on the coordinator node.")
    world_size: int = Field(ge=1, le=MAX_GPUS_PER_JOB, description="Processes in the job, over all nodes.")
    rank_offset: int = Field(
        ge=0, lt=MAX_GPUS_PER_JOB, description="Global rank of this node's first process."
    )
    coordinator_node: NodeId = Field(description="Node of rank 0: the one that receives revokes.")
    coordinator_host: Host = Field(description="MASTER_ADDR for the job's processes.")
    coordinator_port: int = Field(ge=1024, le=65_535, description="MASTER_PORT for the job's processes.")

    @field_validator("node_rank")
    @classmethod
    def _rank_in_range(cls, node_rank: int, info: ValidationInfo) -> int:
        num_nodes = info.data.get("num_nodes")
        if isinstance(num_nodes, int) and node_rank >= num_nodes:
            raise PydanticCustomError(
                "node_rank_out_of_range",
                "node_rank ({rank}) must be < num_nodes ({n})",
                {"rank": node_rank, "n": num_nodes},
            )
        return node_rank

    @field_validator("rank_offset")
    @classmethod
    def _offset_in_range(cls, offset: int, info: ValidationInfo) -> int:
        world = info.data.get("world_size")
        if isinstance(world, int) and offset >= world:
            raise PydanticCustomError(
                "rank_offset_out_of_range",
                "rank_offset ({offset}) must be < world_size ({world})",
                {"offset": offset, "world": world},
            )
        return offset


class LeaseGrant(Command):
    """Run ``spec`` on ``gpus`` of ``node_id`` until revoked (``lease.grant.<node>``)."""

    lease_id: LeaseId
    job_id: JobId
    node_id: NodeId
    gpus: GpuIndices = Field(description="Local GPU indices; the agent sets CUDA_VISIBLE_DEVICES from them.")
    spec: JobSpec = Field(description="The job's spec: argv, env, workdir, grace period.")
    world: WorldInfo | None = Field(default=None, description="None for a single-node job.")
    resume_from: Path | None = Field(default=None, description="Checkpoint to restore; None: start fresh.")
    resume_iteration: Iteration | None = Field(default=None, description="Iteration that checkpoint holds.")
    attempt: int = Field(default=1, ge=1, le=2**31, description="1 for the first lease of the job, then +1.")
    shared: bool = Field(
        default=False,
        description=(
            "The lease may share its GPUs with other shared leases (packing, Gandiva): the agent runs "
            "several leases on one GPU only when every lease on it is shared. False: exclusive, and a "
            "busy GPU is refused with gpu_busy."
        ),
    )

    @model_validator(mode="after")
    def _world_consistent(self) -> LeaseGrant:
        world = self.world
        if world is None:
            return self
        if world.rank_offset + len(self.gpus) > world.world_size:
            raise PydanticCustomError(
                "world_too_small",
                "world.rank_offset ({offset}) + len(gpus) ({n}) exceeds world.world_size ({world})",
                {"offset": world.rank_offset, "n": len(self.gpus), "world": world.world_size},
            )
        if (world.node_rank == 0) != (world.coordinator_node == self.node_id):
            raise PydanticCustomError(
                "coordinator_mismatch",
                "world.coordinator_node must be node_id exactly when world.node_rank is 0",
            )
        return self

    @property
    def is_coordinator(self) -> bool:
        """Whether this node runs rank 0 (and so receives the revoke)."""
        return self.world is None or self.world.node_rank == 0


class RevokeReason(enum.StrEnum):
    """Why the scheduler takes a lease back."""

    PREEMPT = "preempt"
    """Another job needs the GPUs (the job resumes later)."""
    MIGRATE = "migrate"
    """The job moves to other GPUs (a grant follows)."""
    RESIZE = "resize"
    """An elastic job changes its GPU count (a grant follows)."""
    CANCEL = "cancel"
    """The user cancelled the job."""
    TERMINATE = "terminate"
    """The policy ended the job (e.g. converged, Blox §5.3)."""
    DRAIN = "drain"
    """The node is being drained."""


class LeaseRevoke(Command):
    """Stop the lease's job at the next iteration boundary and checkpoint (``lease.revoke.<node>``).

    ``grace_s`` is relative on purpose: the agent computes its own deadline on receipt, so clock
    skew between hosts cannot shorten the grace period. :attr:`grace_deadline` is that deadline on
    the scheduler's clock, for logs and the scheduler's own timer.
    """

    lease_id: LeaseId
    job_id: JobId
    node_id: NodeId = Field(description="The coordinator node of the lease.")
    reason: RevokeReason
    grace_s: float = Field(
        ge=0, le=86_400, description="Time to checkpoint before the agent kills the processes."
    )
    message: Reason | None = None

    @property
    def grace_deadline(self) -> float:
        """``ts + grace_s``: when the grace period ends, on the issuer's clock."""
        return self.ts + self.grace_s


class LeaseAckError(enum.StrEnum):
    """Why an agent refused a grant or a revoke."""

    STALE_EPOCH = "stale_epoch"
    """The command's epoch is older than one the agent already accepted (a deposed leader)."""
    UNKNOWN_LEASE = "unknown_lease"
    """A revoke for a lease the agent does not hold (already stopped, or never granted)."""
    GPU_BUSY = "gpu_busy"
    """A granted GPU is held by another lease."""
    NO_SUCH_GPU = "no_such_gpu"
    """A granted GPU index is not in the node's inventory."""
    WRONG_NODE = "wrong_node"
    """The command names another node."""
    DRAINING = "draining"
    """The node accepts no new leases."""
    JOB_RUNNING = "job_running"
    """The grant's job already runs on this node under another lease that is not stopping: accepting
    it would run the job twice at once (a scheduler that lost track of a live run)."""


class LeaseAck(Event):
    """An agent's reply to a grant or revoke: recorded (``accepted``) or refused with ``error``."""

    lease_id: LeaseId
    node_id: NodeId
    accepted: bool
    error: LeaseAckError | None = None
    duplicate: bool = Field(default=False, description="The agent had already recorded this command.")
    epoch_seen: Epoch = Field(description="Highest epoch the agent has accepted, after this command.")
    message: Message = ""
    leases_held: Counter | None = Field(default=None, description="Leases the node holds after this command.")

    @field_validator("error")
    @classmethod
    def _error_iff_refused(cls, error: LeaseAckError | None, info: ValidationInfo) -> LeaseAckError | None:
        accepted = info.data.get("accepted")
        if accepted is True and error is not None:
            raise PydanticCustomError("error_on_accepted", "an accepted ack must not carry an error")
        return error

    @model_validator(mode="after")
    def _refusal_has_error(self) -> LeaseAck:
        if not self.accepted and self.error is None:
            raise PydanticCustomError("error_required", "a refused ack (accepted=false) needs error")
        return self
