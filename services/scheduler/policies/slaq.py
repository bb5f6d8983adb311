"""``slaq``: highest loss first, time-sliced (Hermes §4.1.3 baseline after SLAQ, SoCC '17).

Hermes (seed 003) describes its SLAQ baseline as "an algorithm for improving the DL quality by
prioritizing jobs with high loss", with a 30 s quantum (§4.1.2). Ranking:

1. running jobs inside their quantum (``time_slicing.protected``);
2. every other job by its latest reported loss, highest first; a job that has reported no loss yet
   ranks first (it must run to be measured: SLAQ's quality feedback needs a first sample);
3. on equal loss a running job before a waiting one (no needless preemption), then submit time,
   then ``seq``.

Choice: this is the Hermes paper's one-line reading of SLAQ (loss as the quality measure); SLAQ's
own normalized-quality-improvement prediction is not modelled. Triggers: timer and churn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState
from services.scheduler.policies.time_slicing import check_quantum, protected


@SCHEDULING.register("slaq")
class Slaq:
    """Protected running jobs, then highest latest loss first."""

    name: ClassVar[str] = "slaq"
    triggers: ClassVar[Trigger] = Trigger.TIMER | Trigger.CHURN

    def __init__(self, *, quantum_s: float = 30.0) -> None:
        self.quantum_s = check_quantum(quantum_s)

    def key(self, job: JobState, now: float) -> tuple[int, float, int, float, int]:
        if protected(job, now, self.quantum_s):
            return (0, 0.0, 0, job.submit_time, job.seq)
        loss = job.loss
        priority = -math.inf if loss is None or not math.isfinite(loss) else -loss
        return (1, priority, 0 if job.is_running else 1, job.submit_time, job.seq)

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        key = self.key
        return Ranking(order=tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: key(j, now))))
