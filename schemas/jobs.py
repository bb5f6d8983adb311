"""Job lifecycle events: submission, admission's verdict, cancellation, and what workers observed.

Flow: a client publishes :class:`JobArrived`; admission answers with :class:`JobAccepted`,
:class:`JobHeld` or :class:`JobRejected`; a client may publish :class:`JobCancel` at any time.
Workers report facts about a lease they hold: :class:`JobStarted`, then one of
:class:`JobSuspended` (stopped, resumable from a checkpoint), :class:`JobCompleted` or
:class:`JobFailed`; while it runs, :class:`JobCheckpointed` for each periodic checkpoint rank 0
completes (so a run lost later resumes from it, not from an older one). All of these are durable
(JetStream) and deduplicated by ``event_id``, so a consumer may see one twice after a redelivery
and must apply it idempotently (e.g. by lease id).

For a multi-node job every node's agent reports :class:`JobStarted` for its own part (``node_id``
tells them apart; the job runs once all parts have started), while the coordinator (rank 0's node)
reports the job-wide :class:`JobCheckpointed`, :class:`JobSuspended`, :class:`JobCompleted` and
:class:`JobFailed`.
"""

from __future__ import annotations

import enum

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from schemas.base import Event
from schemas.fields import Counter, Epoch, GpuIndices, Iteration, Message, Path, PolicyName, Reason, Seconds
from schemas.ids import JobId, LeaseId, NodeId
from schemas.job import JobSpec, UserName

__all__ = [
    "CompletionReason",
    "FailureReason",
    "JobAccepted",
    "JobArrived",
    "JobCancel",
    "JobCheckpointed",
    "JobCompleted",
    "JobFailed",
    "JobHeld",
    "JobRejected",
    "JobStarted",
    "JobSuspended",
    "SuspendReason",
]


class JobArrived(Event):
    """A client submitted a job. ``job_id`` is chosen by the submitter, so a retried submit is
    recognisable (same id) and the client can follow its job without waiting for a reply."""

    job_id: JobId
    spec: JobSpec


class JobAccepted(Event):
    """Admission let the job in; the scheduler now ranks it every round."""

    job_id: JobId
    reason: Reason | None = Field(default=None, description="Why, when the policy says (e.g. quota left).")
    policy: PolicyName | None = Field(default=None, description="Admission policy that decided.")


class JobHeld(Event):
    """Admission postponed the job (quota, cluster full); it is offered again in later rounds."""

    job_id: JobId
    reason: Reason
    policy: PolicyName | None = None


class JobRejected(Event):
    """Admission refused the job for good, with a reason the user can act on."""

    job_id: JobId
    reason: Reason
    policy: PolicyName | None = None


class JobCancel(Event):
    """A user asked to stop a job. The scheduler revokes its lease (if any) and marks it cancelled."""

    job_id: JobId
    user: UserName = Field(
        default="default",
        description="Who asked: the identity the broker authenticated (the subject's last token, "
        "`job.cancel.<user>`). Only the job's owner or an operator may cancel it. The default is "
        "JobSpec's default user, for clusters run without authentication.",
    )
    reason: Reason | None = None


class _LeaseFact(Event):
    """A fact a worker reports about a lease it held: which job, lease, node and epoch."""

    job_id: JobId
    lease_id: LeaseId
    node_id: NodeId
    epoch: Epoch = Field(
        description="Epoch of the grant this fact is about (lets the scheduler drop stale facts)."
    )


class JobStarted(_LeaseFact):
    """The worker launched the job's processes for a lease."""

    gpus: GpuIndices = Field(description="Local GPU indices in use.")
    iteration: Iteration = Field(default=0, description="Iteration it starts from (0, or the resumed one).")
    resumed_from: Path | None = Field(default=None, description="Checkpoint it was restored from, if any.")
    startup_s: Seconds | None = Field(default=None, description="Grant-to-running time (restore cost).")


class JobCheckpointed(_LeaseFact):
    """Rank 0 completed a checkpoint while the job runs (``checkpoint_every``), not at a stop.

    The checkpoint written when a lease stops the job travels with :class:`JobSuspended`; this fact
    is for the periodic ones in between, so that a run lost later (its node goes silent, its agent
    dies) resumes from the newest checkpoint and the scheduler rewinds the job's progress only to it.
    One fact per new checkpoint; a consumer keeps it only if ``iteration`` is newer than the
    checkpoint it knows for the job.
    """

    checkpoint_path: Path = Field(description="The complete checkpoint file.")
    iteration: Iteration = Field(description="Iteration the checkpoint holds (the run resumes after it).")


class SuspendReason(enum.StrEnum):
    """Why a job stopped while it could still resume."""

    PREEMPTED = "preempted"
    """A lease revoke (preemption, migration, resize)."""
    LEASE_EXPIRED = "lease_expired"
    """The worker lost the bus for longer than ``lease_ttl`` and stopped its jobs itself."""
    NODE_SHUTDOWN = "node_shutdown"
    """The worker agent is shutting down (drain, maintenance)."""


class JobSuspended(_LeaseFact):
    """The job stopped at an iteration boundary and can resume from ``checkpoint_path``.

    With two-phase preemption (DESIGN, Leases and preemption) every rank stops after the same
    iteration and rank 0 writes one checkpoint. If the grace period ran out first, the agent
    killed the processes and ``grace_expired`` is true: the checkpoint is then the last good one,
    possibly older than ``iteration`` (FitGpp's GP). A cancelled job whose first process never
    opened its lease channel (a plain script) has no boundary to stop at: it is signalled at once,
    and ``grace_expired`` is true as well.
    """

    reason: SuspendReason
    iteration: Iteration = Field(description="Last iteration the job finished.")
    checkpoint_path: Path | None = Field(default=None, description="None: no checkpoint yet, restart from 0.")
    checkpoint_iteration: Iteration | None = Field(
        default=None, description="Iteration the checkpoint holds."
    )
    grace_expired: bool = Field(
        default=False, description="Processes were signalled: the grace period ran out, or no lease protocol."
    )
    stop_s: Seconds | None = Field(default=None, description="Revoke-to-stopped time (preemption cost).")

    @field_validator("checkpoint_iteration")
    @classmethod
    def _checkpoint_consistent(cls, ckpt: int | None, info: ValidationInfo) -> int | None:
        if ckpt is None:
            return ckpt
        if info.data.get("checkpoint_path") is None:
            raise PydanticCustomError(
                "checkpoint_path_required", "checkpoint_iteration is set but checkpoint_path is not"
            )
        iteration = info.data.get("iteration")
        if isinstance(iteration, int) and ckpt > iteration:
            raise PydanticCustomError(
                "checkpoint_after_iteration",
                "checkpoint_iteration ({ckpt}) is after iteration ({it})",
                {"ckpt": ckpt, "it": iteration},
            )
        return ckpt


class CompletionReason(enum.StrEnum):
    """Why a job finished successfully."""

    EXITED = "exited"
    """The training process exited 0 on its own."""
    LOSS_TARGET = "loss_target"
    """It reached ``spec.loss_target`` (Blox §5.3 loss-based termination)."""
    ITERATIONS = "iterations"
    """It ran ``spec.expected_iterations``."""
    TERMINATED = "terminated"
    """The scheduler's policy ended it (``ScheduleRound.terminate``, e.g. converged)."""


class JobCompleted(_LeaseFact):
    """The job finished successfully; its GPUs are free."""

    reason: CompletionReason = CompletionReason.EXITED
    iteration: Iteration
    exit_code: int = Field(default=0, ge=0, le=255)
    checkpoint_path: Path | None = Field(default=None, description="Final checkpoint (the trained model).")
    loss: float | None = Field(default=None, ge=-1e12, le=1e12, description="Last reported loss.")
    runtime_s: Seconds | None = Field(default=None, description="Wall time of this lease.")


class FailureReason(enum.StrEnum):
    """Why a job failed (it will not be resumed automatically)."""

    EXIT_CODE = "exit_code"
    """A process exited non-zero (``exit_code``)."""
    SIGNAL = "signal"
    """A process was killed by a signal it was not sent by Roundhouse (``signal``; e.g. OOM killer)."""
    LAUNCH_ERROR = "launch_error"
    """The processes could not be started (program not found, bad workdir)."""
    MAX_PREEMPTIONS = "max_preemptions"
    """It was preempted more than ``spec.max_preemptions`` times."""
    NODE_LOST = "node_lost"
    """Its node stopped heartbeating past ``lease_ttl`` (reported by the scheduler)."""


class JobFailed(Event):
    """The job failed, as reported by the worker that ran it (``job.failed.<node_id>``). The lease
    fields are optional for a launch that failed before the lease was set up."""

    job_id: JobId
    reason: FailureReason
    lease_id: LeaseId | None = None
    node_id: NodeId = Field(description="The reporting node: the subject's token, vouched for by the broker.")
    epoch: Epoch | None = None
    iteration: Iteration | None = Field(default=None, description="Last iteration known to have finished.")
    checkpoint_path: Path | None = Field(
        default=None, description="Last good checkpoint, to inspect or resume."
    )
    exit_code: int | None = Field(default=None, ge=0, le=255)
    signal: int | None = Field(default=None, ge=1, le=128)
    message: Message = Field(default="", description="Tail of stderr or the error, for the user.")
    attempts: Counter | None = Field(default=None, description="Leases the job had, this one included.")

    @model_validator(mode="after")
    def _reason_has_detail(self) -> JobFailed:
        if self.reason is FailureReason.EXIT_CODE and not self.exit_code:
            raise PydanticCustomError("exit_code_required", "reason 'exit_code' needs a non-zero exit_code")
        if self.reason is FailureReason.SIGNAL and self.signal is None:
            raise PydanticCustomError("signal_required", "reason 'signal' needs signal")
        return self
