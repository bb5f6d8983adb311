"""Themis finish-time fairness (Mahajan et al., NSDI '20, §3; Blox Table 1 "finish time fair").

Themis defines, per job, ``rho = T_shared / T_ideal``: the finish time it gets in the shared
cluster over the finish time it would get on a private 1/N share of the cluster (N contending
jobs). rho > 1 means the job is worse off than its fair share; Themis serves the jobs with the
largest rho first (its auction offers resources to the 1 - f fraction with the largest rho).
Here the ranking is simply rho descending; there is no auction and no fairness knob f.

How the two times are estimated (the paper measures them with an agent; a policy only has the
snapshot):

* ``T_alone`` is the job's run time alone on its requested GPUs:
  :func:`~services.scheduler.policies.estimates.estimates` (iterations x iteration time, else
  ``expected_duration_s``).
* ``T_shared = (now - submit_time) + remaining``: time already spent in the system plus the
  remaining run time (same function) if the
  job held its GPUs from now on. It is the earliest finish the job can still reach, so rho grows
  while a job waits and stays constant while it runs, which is the signal the policy needs.
* ``T_ideal = T_alone / share``, where ``share = min(1, C / (N x g))`` is the fraction of time a
  job asking for ``g`` GPUs would hold them if the ``C`` GPUs were split equally among the ``N``
  active (admitted, unfinished) jobs: the 1/N-cluster of the paper for rigid gang jobs. Themis
  averages N over the job's lifetime; without history this uses the current N (documented
  deviation).

Jobs without an estimate follow ``on_missing`` like SRTF: last in submit order (default) or an
error. Ties break by submit time, then ``seq``. No ``sort_key`` fast path: a waiting job's rho grows
continuously with ``now`` and every rho depends on N, so no per-job key stays stable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState
from services.scheduler.policies.estimates import (
    MissingEstimate,
    MissingEstimateError,
    estimates,
    parse_missing,
)


def finish_time_fairness(job: JobState, now: float, active_jobs: int, total_gpus: int) -> float | None:
    """rho = T_shared / T_ideal for one job, or None when the job has no runtime estimate."""
    both = estimates(job)
    if both is None:
        return None
    left, alone = both
    share = min(1.0, total_gpus / (max(1, active_jobs) * job.gpus_requested)) if total_gpus > 0 else 1.0
    ideal = alone / share
    shared = max(0.0, now - job.submit_time) + left
    if ideal <= 0:
        return float("inf") if shared > 0 else 1.0
    return shared / ideal


@SCHEDULING.register("themis-ftf")
@dataclass(frozen=True, kw_only=True, slots=True)
class ThemisFtfPolicy:
    """Rank by finish-time fairness rho, largest (worst off) first."""

    name: ClassVar[str] = "themis-ftf"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    on_missing: MissingEstimate = MissingEstimate.LAST
    """What to do with jobs that have no runtime estimate: ``"last"`` or ``"error"``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_missing", parse_missing(self.on_missing))

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        active = len(jobs)
        total = cluster.total_gpus
        keyed: list[tuple[bool, float, float, int, str]] = []
        missing: list[str] = []
        for job in jobs.values():
            rho = finish_time_fairness(job, now, active, total)
            if rho is None:
                missing.append(job.job_id)
                keyed.append((True, 0.0, job.submit_time, job.seq, job.job_id))
            else:
                keyed.append((False, -rho, job.submit_time, job.seq, job.job_id))
        if missing and self.on_missing is MissingEstimate.ERROR:
            raise MissingEstimateError(self.name, missing)
        keyed.sort()
        return Ranking(order=tuple(k[4] for k in keyed))
