"""Admission's memory: the admitted, unfinished jobs (the demand a policy weighs), the held queue,
and which job ids already have a verdict.

On start the ledger is loaded from the scheduler's store (:meth:`Ledger.recover`, the reply to
``query.admission``: docs/control-plane.md, Processes): admitted jobs with their specs, and the jobs
the store holds as ``held`` — with a ``job.held`` verdict or, after a crash between arrival and
verdict, without one; the store does not tell them apart — as *pending*, in submission order, so
they are all judged again, in the order they were held. From then on it follows facts:
``job.arrived`` makes a job pending, ``job.accepted`` / ``job.held`` / ``job.rejected`` are
admission's own verdicts, and ``job.completed`` / ``job.failed`` / ``job.cancel`` end an admitted
job's demand (or take a job out of the held queue). Every method is idempotent: a fact seen twice
changes nothing the second time.

A ``job.rejected`` for a job id that never arrived as a valid spec (admission rejects malformed
submissions by the id their raw JSON names) is ignored, so a user may resubmit a corrected spec
under the same id. Once a job has a verdict, a later ``job.arrived`` with its id is a duplicate
(a retried submit): it is ignored, not judged again. ``decided`` holds the ids seen since this
process started (and those it recovered); a job that finished before then is the scheduler's to
recognise (it keeps one job per id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas.control import AdmissionJob
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
    _seq: int = 0

    # --- start ------------------------------------------------------------------------------
    def recover(self, jobs: Iterable[AdmissionJob]) -> None:
        """Start from the scheduler's unfinished jobs (in submission order): ``held`` ones become
        pending (judged again, in this order), the others admitted demand. Replaces what was here."""
        self.admitted.clear()
        self.held.clear()
        self.pending.clear()
        self.decided.clear()
        self._seq = 0
        for job in jobs:
            self._seq += 1
            state = JobState(job_id=job.job_id, spec=job.spec, submit_time=job.submit_time, seq=self._seq)
            if job.status == JobStatus.HELD.value:
                state.status = JobStatus.HELD
                self.pending[job.job_id] = state
            else:
                admitted = job.admit_time if job.admit_time is not None else job.submit_time
                state.status = JobStatus.QUEUED
                state.admit_time = admitted
                state.queued_since = admitted
                self.admitted[job.job_id] = state
                self.decided.add(job.job_id)

    # --- facts ------------------------------------------------------------------------------
    def on_arrived(self, event: JobArrived) -> JobState | None:
        """Record an arrival as pending; None if the job already arrived or has a verdict."""
        job_id = event.job_id
        if job_id in self.decided or job_id in self.held or job_id in self.pending:
            return None
        self._seq += 1
        job = JobState(job_id=job_id, spec=event.spec, submit_time=event.ts, status=JobStatus.HELD, seq=self._seq)
        self.pending[job_id] = job
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
        return True

    def on_finished(self, job_id: str) -> bool:
        """An admitted job completed, failed or was cancelled, or a waiting one was cancelled.

        Returns True when admitted demand shrank (a held job may now fit)."""
        self.decided.add(job_id)
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
