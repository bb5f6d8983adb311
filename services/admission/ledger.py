"""Admission's memory: the admitted, unfinished jobs (the demand a policy weighs), the held queue,
and which job ids already have a verdict.

Everything here follows from facts on the lifecycle stream, so after a restart the ledger is
rebuilt by replaying them (docs/control-plane.md, Processes): ``job.arrived`` makes a job pending,
``job.accepted`` / ``job.held`` / ``job.rejected`` are admission's own verdicts, and
``job.completed`` / ``job.failed`` / ``job.cancel`` end an admitted job's demand (or take a job out
of the held queue). Every method is idempotent: a fact seen twice changes nothing the second time.

A ``job.rejected`` for a job id that never arrived as a valid spec (admission rejects malformed
submissions by the id their raw JSON names) is ignored, so a user may resubmit a corrected spec
under the same id. Once a job has a verdict, a later ``job.arrived`` with its id is a duplicate
(a retried submit): it is ignored, not judged again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from schemas.jobs import JobArrived
from services.core.state import JobState, JobStatus


@dataclass(slots=True)
class Ledger:
    admitted: dict[str, JobState] = field(default_factory=dict)
    """Admitted, unfinished jobs: the ``jobs`` an admission policy is given."""
    held: dict[str, JobState] = field(default_factory=dict)
    """Held jobs in the order they were held (FIFO: they are offered again in this order)."""
    pending: dict[str, JobState] = field(default_factory=dict)
    """Arrived jobs without a verdict yet, in arrival order."""
    decided: set[str] = field(default_factory=set)
    """Ids with a verdict (accepted, rejected or finished): a new arrival with one is a duplicate."""
    arrival_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    """The ``event_id`` of each held or pending job's arrival (verdict event ids derive from it)."""
    _seq: int = 0

    # --- facts ------------------------------------------------------------------------------
    def on_arrived(self, event: JobArrived) -> JobState | None:
        """Record an arrival as pending; None if the job already arrived or has a verdict."""
        job_id = event.job_id
        if job_id in self.decided or job_id in self.held or job_id in self.pending:
            return None
        self._seq += 1
        job = JobState(job_id=job_id, spec=event.spec, submit_time=event.ts, status=JobStatus.HELD, seq=self._seq)
        self.pending[job_id] = job
        self.arrival_ids[job_id] = event.event_id
        return job

    def on_accepted(self, job_id: str, now: float) -> bool:
        """A pending or held job was accepted; False if it was neither (nothing changed)."""
        job = self.pending.pop(job_id, None) or self.held.pop(job_id, None)
        if job is None:
            return False
        job.status = JobStatus.QUEUED
        job.admit_time = now
        job.queued_since = now
        self.admitted[job_id] = job
        self.decided.add(job_id)
        self.arrival_ids.pop(job_id, None)
        return True

    def on_held(self, job_id: str) -> bool:
        """A pending job was held; False if it was not pending."""
        job = self.pending.pop(job_id, None)
        if job is None:
            return False
        self.held[job_id] = job
        return True

    def on_rejected(self, job_id: str) -> bool:
        """A pending or held job was rejected; False otherwise (e.g. a malformed submission)."""
        job = self.pending.pop(job_id, None) or self.held.pop(job_id, None)
        if job is None:
            return False
        job.status = JobStatus.REJECTED
        self.decided.add(job_id)
        self.arrival_ids.pop(job_id, None)
        return True

    def on_finished(self, job_id: str) -> bool:
        """An admitted job completed, failed or was cancelled, or a waiting one was cancelled.

        Returns True when admitted demand shrank (a held job may now fit)."""
        self.decided.add(job_id)
        self.arrival_ids.pop(job_id, None)
        if self.held.pop(job_id, None) is not None or self.pending.pop(job_id, None) is not None:
            return False
        return self.admitted.pop(job_id, None) is not None

    # --- reads --------------------------------------------------------------------------------
    @property
    def admitted_gpus(self) -> int:
        """GPUs requested by the admitted, unfinished jobs."""
        return sum(job.spec.gpus for job in self.admitted.values())

    def knows(self, job_id: str) -> bool:
        """Whether ``job_id`` arrived as a valid spec (pending, held or decided)."""
        return job_id in self.decided or job_id in self.held or job_id in self.pending
