"""``fitgpp`` ranking: TE FIFO ahead of BE FIFO, preempted BE jobs at the head of the BE queue.

FitGpp (seed 000, §2.1) is "built on the FIFO principle", with two job classes: trial-and-error
(TE) jobs that must start with low latency, and best-effort (BE) jobs. "The preempted BE jobs are
placed back on the top of the queue to observe the FIFO." The preemption itself is done by the
``preempting`` placement with a victim policy (``fitgpp``, ``lrtp`` or ``rand``); this ranking
says who is next:

1. TE jobs, by submit time (FIFO);
2. BE jobs that have been preempted (``preemptions > 0``) or are running, by submit time: a
   suspended BE job is at the top of the BE queue, ahead of every BE job that never ran;
3. the other BE jobs, by submit time;

ties by ``seq``. Choices where the paper is silent: TE jobs are always ahead of BE jobs (the
paper's queue holds TE jobs only until they preempt their way in, which on arrival they always try;
putting them first keeps a waiting TE job from being overtaken by BE jobs); several preempted BE
jobs are FIFO among themselves (by submit time).

Non-preemptive by rank (``Ranking.preempt`` is False): only the TE-triggered preemption of the
placement suspends jobs. Triggers: timer and churn, because FitGpp preempts when a TE job *arrives*
(not at the next round edge) and a completion frees room for the head of the queue.

Fast path: ``sort_key`` never changes while a job waits (``key_stable_until`` = inf).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

from schemas.job import JobClass
from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState


@SCHEDULING.register("fitgpp")
class FitGppRanking:
    """TE FIFO, then preempted/running BE FIFO, then new BE FIFO; never preempts by rank."""

    name: ClassVar[str] = "fitgpp"
    triggers: ClassVar[Trigger] = Trigger.TIMER | Trigger.CHURN
    preemptive: ClassVar[bool] = False

    def sort_key(self, job: JobState, now: float) -> tuple[int, int, float, int]:
        """(class: TE 0 / BE 1, BE: 0 if ever preempted or running else 1, submit time, seq)."""
        if job.job_class is JobClass.TE:
            return (0, 0, job.submit_time, job.seq)
        resumed = 0 if (job.preemptions > 0 or job.is_running) else 1
        return (1, resumed, job.submit_time, job.seq)

    def key_stable_until(self, job: JobState, now: float) -> float:
        return math.inf

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        key = self.sort_key
        order = tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: key(j, now)))
        return Ranking(order=order, preempt=False)
