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

from typing import ClassVar

from services.core.registry import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.time_slicing import QuantumRanking


@SCHEDULING.register("rr")
class RoundRobin(QuantumRanking):
    """Protected running jobs, then everyone by the time they joined the queue."""

    name: ClassVar[str] = "rr"

    def order_key(self, job: JobState, now: float) -> tuple[float, int]:
        if job.is_running:
            return (now, 1)  # its quantum is over: it rejoins the tail now, behind every waiting job
        joined = job.queued_since
        if joined is None:
            joined = job.last_preempt_time if job.last_preempt_time is not None else job.submit_time
        return (joined, 0)
