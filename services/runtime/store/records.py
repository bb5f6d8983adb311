"""Typed values the store reads and writes. Plain frozen dataclasses: no SQLAlchemy objects escape."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypedDict

from schemas.job import JobClass, JobSpec
from services.core.decisions import Plan
from services.core.state import JobState, JobStatus


class LeaseState(enum.StrEnum):
    """Life of a lease (Blox §7): granted until revoked; revoking while the job checkpoints."""

    GRANTED = "granted"
    REVOKING = "revoking"
    RELEASED = "released"


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as persisted: its spec plus the state the scheduler tracks, and the row version."""

    job_id: str
    spec: JobSpec
    submit_time: float
    status: JobStatus = JobStatus.QUEUED
    admit_time: float | None = None
    first_start_time: float | None = None
    last_start_time: float | None = None
    last_preempt_time: float | None = None
    finish_time: float | None = None
    attained_service: float = 0.0
    executed_time: float = 0.0
    iterations_done: int = 0
    preemptions: int = 0
    checkpoint_path: str | None = None
    checkpoint_iteration: int | None = None
    """Iteration the checkpoint at ``checkpoint_path`` holds (None: no checkpoint, or not known)."""
    seq: int = 0
    """Submission sequence number assigned by the scheduler (ties in every ranking break on it)."""
    queued_since: float | None = None
    """When the job last started waiting for GPUs; None while running or finished."""
    longest_wait_s: float = 0.0
    version: int = 1
    """Row version: 1 when added, +1 on every update. Pass it as ``expected_version`` to update."""
    reason: str | None = None
    """Why it failed, was cancelled or rejected (None: not said, or it did not end so)."""
    exit_code: int | None = None
    """A failed job's non-zero exit code."""
    signal: int | None = None
    """The signal that killed a failed job."""

    @property
    def user(self) -> str:
        return self.spec.user

    @property
    def job_class(self) -> JobClass:
        return self.spec.job_class

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @classmethod
    def from_state(
        cls,
        state: JobState,
        *,
        checkpoint_path: str | None = None,
        checkpoint_iteration: int | None = None,
        version: int = 1,
    ) -> JobRecord:
        """The persisted form of a policy-facing ``JobState`` (held GPUs live in leases, not here)."""
        return cls(
            job_id=state.job_id,
            spec=state.spec,
            submit_time=state.submit_time,
            status=state.status,
            admit_time=state.admit_time,
            first_start_time=state.first_start_time,
            last_start_time=state.last_start_time,
            last_preempt_time=state.last_preempt_time,
            finish_time=state.finish_time,
            attained_service=state.attained_service,
            executed_time=state.executed_time,
            iterations_done=state.iterations_done,
            preemptions=state.preemptions,
            checkpoint_path=checkpoint_path,
            checkpoint_iteration=checkpoint_iteration,
            seq=state.seq,
            queued_since=state.queued_since,
            longest_wait_s=state.longest_wait_s,
            version=version,
        )

    def to_state(self, gpus: tuple[int, ...] = ()) -> JobState:
        """A fresh ``JobState`` for the scheduler's in-memory view; ``gpus`` are the global ids held.
        What the store does not keep (loss history, iteration time) starts empty."""
        return JobState(
            job_id=self.job_id,
            spec=self.spec,
            submit_time=self.submit_time,
            status=self.status,
            admit_time=self.admit_time,
            first_start_time=self.first_start_time,
            last_start_time=self.last_start_time,
            last_preempt_time=self.last_preempt_time,
            finish_time=self.finish_time,
            attained_service=self.attained_service,
            executed_time=self.executed_time,
            iterations_done=self.iterations_done,
            preemptions=self.preemptions,
            gpus=gpus,
            seq=self.seq,
            queued_since=self.queued_since,
            longest_wait_s=self.longest_wait_s,
        )


class JobChanges(TypedDict, total=False):
    """The mutable fields of a job; an update sets exactly the keys present."""

    status: JobStatus
    admit_time: float | None
    first_start_time: float | None
    last_start_time: float | None
    last_preempt_time: float | None
    finish_time: float | None
    attained_service: float
    executed_time: float
    iterations_done: int
    preemptions: int
    checkpoint_path: str | None
    checkpoint_iteration: int | None
    queued_since: float | None
    longest_wait_s: float
    reason: str | None
    exit_code: int | None
    signal: int | None


JOB_CHANGE_FIELDS: frozenset[str] = frozenset(JobChanges.__annotations__)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """GPUs ``gpu_indices`` (local to ``node_id``) granted to ``job_id`` under leader ``epoch``."""

    lease_id: str
    job_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    epoch: int
    granted_at: float
    state: LeaseState = LeaseState.GRANTED
    revoke_deadline: float | None = None
    """When a revoke's grace period ends (set while REVOKING)."""


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """A decided round: its number, the leader epoch, the state version it ranked on, and the plan."""

    round_number: int
    epoch: int
    state_version: int
    decided_at: float
    plan: Plan


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters of the batched writer, for tests, benchmarks and metrics."""

    transactions: int = 0
    """Transactions committed (a batch is one, plus one more if it had to be retried in isolation)."""
    batches: int = 0
    requests: int = 0
    """Write requests resolved (successful, no-op or failed)."""
    rows: int = 0
    """Rows named by the operations of successful requests."""
    isolated_retries: int = 0
    """Batches that failed as a whole and were retried request by request."""
    claim_retries: int = 0
    """Batches retried because an event in them had been applied before (a redelivery)."""
    failed_requests: int = 0
