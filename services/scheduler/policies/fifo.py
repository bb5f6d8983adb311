"""``fifo``: first in, first out by submit time (Blox §4.1 FIFO, as in Philly; FitGpp §3 baseline).

Non-preemptive: a job that holds GPUs keeps them until it finishes, and a round only fills free
GPUs in submit order. A job that was suspended by some other mechanism keeps its place (its submit
time), i.e. it goes back to the top of the queue, as FitGpp §2.1 asks of preempted jobs.

Fast path: ``sort_key`` = (submit time, seq), which never changes, so owners keep an incremental
order (``services.core.ordering.KeyedOrder``) instead of sorting every round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState


@SCHEDULING.register("fifo")
class Fifo:
    """Rank by submit time; never preempt."""

    name: ClassVar[str] = "fifo"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = False

    def sort_key(self, job: JobState, now: float) -> tuple[Any, ...]:
        return (job.submit_time, job.seq)

    def key_stable_until(self, job: JobState, now: float) -> float:
        return math.inf

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        key = self.sort_key
        order = tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: key(j, now)))
        return Ranking(order=order, preempt=False)
