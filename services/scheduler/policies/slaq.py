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
from typing import ClassVar

from services.core.registry import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.time_slicing import QuantumRanking


@SCHEDULING.register("slaq")
class Slaq(QuantumRanking):
    """Protected running jobs, then highest latest loss first."""

    name: ClassVar[str] = "slaq"

    def order_key(self, job: JobState, now: float) -> tuple[float, int]:
        loss = job.loss
        priority = -math.inf if loss is None or not math.isfinite(loss) else -loss
        return (priority, 0 if job.is_running else 1)
