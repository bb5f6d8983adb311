"""``las`` (and ``las-time``): least attained service first (Blox §4.1 "single-queue LAS", Table 3; after Tiresias).

Jobs are ranked by attained service, GPU-seconds of productive execution so far (GPUs x executed
time, Tiresias' definition; for the 1-GPU jobs of Blox's Philly workload this equals Blox's
executed time). Newly arrived jobs (zero service) therefore go first and long-running jobs are
preempted for them: LAS is preemptive and round-based (Blox rounds, default 300 s).

Starvation guard, as Blox implements it (``blox_manager.py``, ``priority_thresh``): a job that has
waited continuously for ``starvation_s`` (Blox: 3600 x 1000 s) is promoted for good and from then on
ranks ahead of every job that was never promoted (among promoted jobs, LAS order again). Blox counts
the wait in whole rounds; we count it continuously. ``starvation_s=None`` gives pure LAS.

Fast path: ``sort_key`` = (not promoted, attained service, submit time, seq). A waiting job's key
changes only when its promotion comes due, which ``key_stable_until`` announces; a running job's
key changes only through its attained service, which ``key_parts`` declares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from services.core.decisions import Ranking
from services.core.protocols import Trigger
from services.core.registry import SCHEDULING
from services.core.state import ClusterState, JobState, JobStatus
from services.scheduler.policies.starvation import (
    BLOX_STARVATION_S,
    check_starvation_s,
    starvation_due,
    starved,
)

_QUEUED = JobStatus.QUEUED


@SCHEDULING.register("las")
class Las:
    """Least attained service first, with Blox's starvation promotion."""

    name: ClassVar[str] = "las"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    def __init__(self, *, starvation_s: float | None = BLOX_STARVATION_S) -> None:
        check_starvation_s(starvation_s)
        self.starvation_s = starvation_s

    def promoted(self, job: JobState, now: float) -> bool:
        """Whether ``job`` has ever waited ``starvation_s`` in one stretch (sticky, as in Blox)."""
        return starved(job, now, self.starvation_s)

    def sort_key(self, job: JobState, now: float) -> tuple[Any, ...]:
        # ``promoted`` inlined: this runs for every job that changes state in a simulation. With
        # ``limit > 0``, ``max(0, now - since) >= limit`` is ``now - since >= limit``.
        limit = self.starvation_s
        if limit is None:
            promoted = False
        elif job.longest_wait_s >= limit:
            promoted = True
        else:
            since = job.queued_since
            promoted = since is not None and job.status is _QUEUED and now - since >= limit
        return (0 if promoted else 1, job.attained_service, job.submit_time, job.seq)

    def key_parts(self, job: JobState) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """For a running job: ``sort_key == (*head, attained_service, *tail)`` at every ``now``
        (a running job's wait is over, so its promotion cannot change while it runs)."""
        limit = self.starvation_s
        promoted = limit is not None and job.longest_wait_s >= limit
        return (0 if promoted else 1,), (job.submit_time, job.seq)

    def key_stable_until(self, job: JobState, now: float) -> float:
        return starvation_due(job, now, self.starvation_s)

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        key = self.sort_key
        order = tuple(j.job_id for j in sorted(jobs.values(), key=lambda j: key(j, now)))
        return Ranking(order=order)


@SCHEDULING.register("las-time")
class LasTime(Las):
    """LAS by executed wall time, whatever the GPU count: the attained service of Blox's released
    code (its job state adds the round's length to ``attained_service`` each round a job runs), as
    opposed to Tiresias' GPU-seconds that ``las`` uses. The two rank alike when every job has one
    GPU (Blox's default workload); with multi-GPU jobs wide jobs age slower here. Same starvation
    promotion. For comparisons with Blox's simulator on multi-GPU workloads.

    A running job's executed time grows at one second per second, not ``len(gpus)``, so this has no
    ``key_parts``: owners re-key running jobs each round (``services.core.ordering``)."""

    name: ClassVar[str] = "las-time"
    key_parts = None  # type: ignore[assignment]  # see the class docstring

    def sort_key(self, job: JobState, now: float) -> tuple[Any, ...]:
        return (0 if self.promoted(job, now) else 1, job.executed_time, job.submit_time, job.seq)
