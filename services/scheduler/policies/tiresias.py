"""Tiresias discretized two-dimensional LAS (Gu et al., NSDI '19, §3.2; Blox Table 7).

What the paper prescribes, and how it is done here:

* **2D attained service** (§3.2.1): a job's service is GPUs x time, i.e. ``attained_service``
  (GPU-seconds), not wall time, so wide jobs age faster.
* **Discretized priorities / MLFQ** (§3.2.2): K queues split by thresholds on attained service.
  A job is in queue ``i`` when ``thresholds[i-1] <= service < thresholds[i]`` (demotion happens on
  reaching a threshold, as in the reference simulator's ``j_gt >= queue_limit``). Defaults follow
  the paper's recommendation that K = 2 is enough: one threshold of 3600 GPU-seconds (the
  setting other reimplementations cite as the paper's; the reference simulator's ``dlas-gpu``
  uses 3250 and 7200 with K = 3). Both K and the thresholds are options.
* **FIFO within a queue** (§3.2.2), keeping a running job ahead of the waiting ones of its queue
  once it has run *in that queue*, as the reference simulator does after each pass (``run_sim.py``
  moves PENDING jobs behind RUNNING ones), so a queue is non-preemptive within itself: such a job is
  displaced only by a job of a higher queue. A job demoted *during its current run* has not: the
  reference appends it at the tail of its new queue, behind the jobs already waiting there, so at
  the next pass they take its GPUs (MLFQ: demotion sends a job to the back of the lower queue). It
  is ranked with the waiting jobs of its new queue until its run ends. Waiting jobs of one queue
  are FIFO by the time they entered it: submit time, or for a promoted job the moment it crossed
  the starvation limit. (With jobs of one width that is the reference's queue-entry order: jobs
  cross a threshold in the order they started, which is submit order in the FIFO queue above.)
* **Starvation** (§3.2.2 "Avoiding starvation"): a waiting job below the top queue is promoted to
  Q1 (index 0 here) when it has waited ``promote_knob`` x its execution time (STARVELIMIT, the
  PROMOTEKNOB of §5.4.3). ``promote_knob=None`` disables it. The default 8 is the value other
  Tiresias reimplementations use; the reference simulator sweeps 1..1000.

Statelessness (where this deviates, and why): the paper resets a promoted job's execution time and
waiting time to zero so that it is not demoted right away. A policy here is a pure function of the
snapshot, which holds no "promoted at" mark, so the reset is reconstructed from the snapshot:

* waiting time is the current wait (``now - queued_since``, else ``now - last_preempt_time``) and
  execution time is the job's total ``executed_time``. Without the reset the second promotion of
  the same job needs a longer wait than in the paper (conservative: fewer promotions, never more).
* a running job whose current run started as a promotion (its wait before this run was at least
  ``promote_knob`` x its execution time before this run) stays in Q1 until this run alone has
  earned ``thresholds[0]`` GPU-seconds, which is exactly what the reset buys it in the paper.

Jobs with no service and no runs are in Q1 by their submit time. Ties break by ``seq``.

Fast path: ``sort_key``/``key_stable_until`` (a waiting job's key changes only when its promotion
comes due), so owners can keep the order incrementally (``services.core.ordering``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState, JobStatus

_SERVICE_EPSILON = 1e-6
"""GPU-seconds of rounding tolerated when a running job's service at its run's start is rebuilt from
its service now: a job suspended exactly on a threshold ran its new run in the lower queue."""


@SCHEDULING.register("tiresias")
@dataclass(frozen=True, kw_only=True, slots=True)
class TiresiasPolicy:
    """Discretized 2D-LAS: queues by GPU-seconds attained, FIFO inside a queue, starvation promotion."""

    name: ClassVar[str] = "tiresias"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    queue_thresholds_gpu_s: Sequence[float] = (3600.0,)
    """Upper limits (GPU-seconds) of every queue but the last; K = len + 1 queues."""
    promote_knob: float | None = 8.0
    """PROMOTEKNOB: promote a waiting job once wait >= knob x execution time; None disables."""

    def __post_init__(self) -> None:
        thresholds = tuple(float(t) for t in self.queue_thresholds_gpu_s)
        if any(t <= 0 for t in thresholds) or any(b <= a for a, b in pairwise(thresholds)):
            raise ValueError(
                f"queue_thresholds_gpu_s must be positive and strictly increasing, got {thresholds}"
            )
        object.__setattr__(self, "queue_thresholds_gpu_s", thresholds)
        if self.promote_knob is not None and self.promote_knob <= 0:
            raise ValueError(f"promote_knob must be > 0 (or None to disable), got {self.promote_knob}")

    def _wait_start(self, job: JobState) -> float | None:
        """When the current wait of a job that ran before began (None if it never ran)."""
        if job.executed_time <= 0:
            return None
        return job.queued_since if job.queued_since is not None else job.last_preempt_time

    def queue_of(self, job: JobState, now: float) -> tuple[int, float]:
        """The job's queue index (0 = highest) and the time it entered that queue."""
        queue, entered, _ = self._place_in_queues(job, now)
        return queue, entered

    def _place_in_queues(self, job: JobState, now: float) -> tuple[int, float, bool]:
        """(queue, time entered it, whether the job is running and already ran in it)."""
        thresholds = self.queue_thresholds_gpu_s
        queue = bisect_right(thresholds, job.attained_service)
        running = job.status is JobStatus.RUNNING
        knob = self.promote_knob
        if queue == 0:
            return 0, job.submit_time, running  # Q1 is entered by arrival, never during a run
        promoted_run = False
        if knob is not None and job.status is JobStatus.QUEUED:
            waiting_since = self._wait_start(job)
            if waiting_since is not None:
                due = waiting_since + knob * job.executed_time
                if now >= due:
                    return 0, due, False
        elif knob is not None and running and job.last_start_time is not None:
            started, preempted = job.last_start_time, job.last_preempt_time
            run = max(0.0, now - started)
            executed_before = job.executed_time - run
            if preempted is not None and preempted <= started and executed_before > 0:
                due = preempted + knob * executed_before
                if started >= due:
                    if run * len(job.gpus) < thresholds[0]:
                        return 0, due, True  # started by its promotion: it runs in Q1
                    promoted_run = True  # demoted from Q1 during this run
        if not running or promoted_run:
            return queue, job.submit_time, False
        ran_in_queue = self._service_at_run_start(job, now) >= thresholds[queue - 1] - _SERVICE_EPSILON
        return queue, job.submit_time, ran_in_queue

    @staticmethod
    def _service_at_run_start(job: JobState, now: float) -> float:
        """A running job's attained service when its current run began.

        The owner's ``run_start_service`` when it gives one (the simulator and the scheduler do);
        otherwise rebuilt as service now minus GPUs x the run's productive time so far (from
        ``resumed_at``, else ``last_start_time``).
        """
        if job.run_start_service is not None:
            return job.run_start_service
        productive_from = job.resumed_at if job.resumed_at is not None else job.last_start_time
        if productive_from is None:
            return job.attained_service
        return job.attained_service - len(job.gpus) * max(0.0, now - productive_from)

    def sort_key(self, job: JobState, now: float) -> tuple[int, bool, float, float, int]:
        """(queue, not (running and ran in this queue), time entered the queue, submit time, seq);
        ascending is the ranking."""
        queue, entered, settled = self._place_in_queues(job, now)
        return (queue, not settled, entered, job.submit_time, job.seq)

    def key_stable_until(self, job: JobState, now: float) -> float:
        """A waiting job's key changes only when its starvation promotion comes due."""
        knob = self.promote_knob
        if knob is None or job.is_running:
            return math.inf
        if bisect_right(self.queue_thresholds_gpu_s, job.attained_service) == 0:
            return math.inf
        waiting_since = self._wait_start(job)
        if waiting_since is None:
            return math.inf
        due = waiting_since + knob * job.executed_time
        return due if due > now else math.inf

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        # sort_key, inlined for the common cases: this loop runs over every job each round.
        thresholds = self.queue_thresholds_gpu_s
        top = thresholds[0]
        knob = self.promote_knob
        key = self.sort_key
        queued = JobStatus.QUEUED
        keyed: list[tuple[tuple[int, bool, float, float, int], str]] = []
        for job in jobs.values():
            service = job.attained_service
            if service < top:  # Q1: nothing to promote
                waiting = job.status is not JobStatus.RUNNING
                keyed.append(((0, waiting, job.submit_time, job.submit_time, job.seq), job.job_id))
            elif job.status is queued:
                queue, entered = bisect_right(thresholds, service), job.submit_time
                executed = job.executed_time
                if knob is not None and executed > 0:
                    since = job.queued_since if job.queued_since is not None else job.last_preempt_time
                    if since is not None and now >= since + knob * executed:
                        queue, entered = 0, since + knob * executed
                keyed.append(((queue, True, entered, job.submit_time, job.seq), job.job_id))
            else:
                keyed.append((key(job, now), job.job_id))
        keyed.sort()
        return Ranking(order=tuple(k[1] for k in keyed))
