"""Invariants the simulator checks after every event in debug mode (``SimConfig.debug``).

* no GPU is double-booked (several jobs on one GPU only where a packing plan put them:
  ``ClusterState.shared_gpus``), and the cluster's view of who holds which GPU matches the jobs' view;
* a job that is not running (waiting, held, suspended) holds no GPU;
* work is conserved: done work is between 0 and the job's total, and productive time never
  exceeds the time since submission (so JCT >= run time);
* loss samples (jobs with a loss curve) are in time order, no later than ``now``, and at most
  ``HISTORY_LIMIT``; a job that never started reports no loss;
* policies do not mutate their inputs (``snapshot_inputs`` before and after a round, loss fields
  included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from services.core.simulation.loss import HISTORY_LIMIT
from services.core.state import ClusterState, JobState, JobStatus

_EPS = 1e-6


class InvariantError(AssertionError):
    """The simulator's state broke one of its invariants (a bug in the simulator or a policy)."""


class _Progress(Protocol):
    @property
    def work_s(self) -> float: ...
    @property
    def done_s(self) -> float: ...


def check_invariants(
    active: Mapping[str, JobState],
    pending: Sequence[JobState],
    sims: Mapping[str, _Progress],
    cluster: ClusterState,
    now: float,
) -> None:
    holders: dict[int, str] = {}
    shared = cluster.shared_gpus
    sharing: dict[int, tuple[str, ...]] = {}
    for gpu_id, jobs in enumerate(cluster.gpu_jobs):
        if len(jobs) > 1:
            if gpu_id not in shared:  # only a packing plan may put several jobs on one GPU
                raise InvariantError(f"t={now}: GPU {gpu_id} is double-booked by {jobs}")
            sharing[gpu_id] = jobs
        if jobs:
            holders[gpu_id] = jobs[0]
    if cluster.free_gpu_count != cluster.total_gpus - len(holders):
        raise InvariantError(f"t={now}: free GPU count {cluster.free_gpu_count} disagrees with the GPU table")
    held_by_jobs = 0
    for job_id, job in active.items():
        if job.status is JobStatus.RUNNING:
            if not job.gpus:
                raise InvariantError(f"t={now}: running job {job_id} holds no GPU")
            for g in job.gpus:
                if holders.get(g) != job_id and job_id not in sharing.get(g, ()):
                    raise InvariantError(
                        f"t={now}: job {job_id} thinks it holds GPU {g}, the cluster says {holders.get(g)}"
                    )
            held_by_jobs += len(job.gpus)
        elif job.status is JobStatus.QUEUED:
            if job.gpus:
                raise InvariantError(f"t={now}: waiting job {job_id} still holds GPUs {job.gpus}")
        else:
            raise InvariantError(f"t={now}: job {job_id} is {job.status} but still active")
        sim = sims[job_id]
        if not -_EPS <= sim.done_s <= sim.work_s * (1 + _EPS) + _EPS:
            raise InvariantError(f"t={now}: job {job_id} did {sim.done_s} s of {sim.work_s} s of work")
        if job.executed_time > now - job.submit_time + _EPS:
            raise InvariantError(
                f"t={now}: job {job_id} ran {job.executed_time} s since its submission at {job.submit_time}"
            )
        _check_loss(job_id, job, now)
    held_by_jobs -= sum(len(jobs) - 1 for jobs in sharing.values())  # a shared GPU counts once
    if held_by_jobs != len(holders):
        raise InvariantError(f"t={now}: jobs hold {held_by_jobs} GPUs but the cluster has {len(holders)} busy")
    for job in pending:
        if job.gpus or job.status is JobStatus.RUNNING:
            raise InvariantError(f"t={now}: job {job.job_id} is not admitted yet but holds GPUs")


def _check_loss(job_id: str, job: JobState, now: float) -> None:
    history = job.loss_history
    if not history:
        return
    if job.first_start_time is None or job.loss is None:
        raise InvariantError(f"t={now}: job {job_id} has loss samples but never ran")
    if len(history) > HISTORY_LIMIT:
        raise InvariantError(f"t={now}: job {job_id} keeps {len(history)} loss samples (limit {HISTORY_LIMIT})")
    last = -float("inf")
    for t, _ in history:
        if t < last or t > now + _EPS:
            raise InvariantError(f"t={now}: job {job_id}'s loss samples are out of order or in the future at {t}")
        last = t


def snapshot_inputs(active: Mapping[str, JobState], cluster: ClusterState) -> tuple[Any, ...]:
    """A comparable copy of everything a policy could mutate."""
    jobs = tuple(
        (
            job_id,
            job.status,
            job.gpus,
            job.attained_service,
            job.executed_time,
            job.preemptions,
            job.first_start_time,
            job.queued_since,
            job.longest_wait_s,
            job.iterations_done,
            job.loss,
            tuple(job.loss_history),
        )
        for job_id, job in active.items()
    )
    return (jobs, tuple(cluster.gpu_jobs), cluster.free_gpu_count)
