"""``rr``: time-sliced round robin with a fixed quantum (Hermes §4.1.3 baseline, as in Gandiva).

Hermes (seed 003) compares against "RR with GPU time-sharing because previous works such as Gandiva,
Tiresias, and Themis adopt this policy", with a 30 s quantum (§4.1.2). Ranking:

1. running jobs inside their quantum (``time_slicing.protected``), so they keep their GPUs;
2. every other job by the time it joined the run queue, earliest first: a waiting job's
   ``queued_since`` (else its last preemption, else its submit time); a running job whose quantum
   is over rejoins the tail *now*, behind every job already waiting;

ties by ``seq``. With the ``hermes`` placement (per-GPU queues) this is round robin on each GPU;
with a cluster-wide placement it is cluster-wide round robin. Triggers: timer and churn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState
from services.scheduler.policies.time_slicing import check_quantum, protected


@SCHEDULING.register("rr")
class RoundRobin:
    """Protected running jobs, then everyone by the time they joined the queue."""

    name: ClassVar[str] = "rr"
    triggers: ClassVar[Trigger] = Trigger.TIMER | Trigger.CHURN

    def __init__(self, *, quantum_s: float = 30.0) -> None:
        self.quantum_s = check_quantum(quantum_s)

    def key(self, job: JobState, now: float) -> tuple[int, float, int, float, int]:
        if protected(job, now, self.quantum_s):
            return (0, 0.0, 0, job.submit_time, job.seq)
        if job.is_running:
            return (1, now, 1, job.submit_time, job.seq)
        joined = job.queued_since
        if joined is None:
            joined = job.last_preempt_time if job.last_preempt_time is not None else job.submit_time
        return (1, joined, 0, job.submit_time, job.seq)

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        key = self.key
        return Ranking(order=tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: key(j, now))))
