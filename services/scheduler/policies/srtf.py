"""Shortest remaining time first (SRTF), preemptive.

Follows Blox (EuroSys '24) §5.2, which uses SRTF as one of the policies its synthesizer switches
between, and its ``schedulers/srtf.py``: jobs are ordered by estimated remaining time, shortest
first. The Tiresias simulator's ``shortest`` policy is the same rule (``duration - executed_time``).

Choices where the papers are silent:

* Remaining time comes from :func:`services.scheduler.policies.estimates.remaining_seconds`
  (iterations left x measured iteration time, else declared duration minus executed time). It is
  wall time at the job's own GPU count, not GPU-time (that would be SRSF, Tiresias §2.3).
* Jobs without an estimate: with ``on_missing="last"`` (default) they rank after every job with
  an estimate, in submit order, so a cluster with a few unannotated jobs keeps working and those
  jobs are served FIFO from the leftover capacity; with ``on_missing="error"`` ranking raises
  :class:`~services.scheduler.policies.estimates.MissingEstimateError` naming them.
* Ties (equal remaining time) break by submit time, then ``seq`` (submission order), so the order is total and
  deterministic. Running and waiting jobs compete alike: SRTF preempts.
* Starvation: Blox's promotion (``services.scheduler.policies.starvation``; every Blox policy sorts
  by it first): a job that has waited ``starvation_s`` (default Blox's 1000 h) in one stretch ranks
  ahead of every job that has not, for good; SRTF order among each group. ``None`` disables it.
* Triggers: timer and churn, since an arrival or a completion can change who is shortest.
* Fast path: ``sort_key``/``key_stable_until`` (a waiting job's key changes only when its
  promotion comes due), so owners can keep the order incrementally. With ``on_missing="error"``,
  ``sort_key`` raises too.
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
    remaining_seconds,
)
from services.scheduler.policies.starvation import (
    BLOX_STARVATION_S,
    check_starvation_s,
    starvation_due,
    starved,
)

_UNKNOWN = float("inf")


@SCHEDULING.register("srtf")
@dataclass(frozen=True, kw_only=True, slots=True)
class SrtfPolicy:
    """Rank by estimated remaining seconds, shortest first."""

    name: ClassVar[str] = "srtf"
    triggers: ClassVar[Trigger] = Trigger.TIMER | Trigger.CHURN
    preemptive: ClassVar[bool] = True

    on_missing: MissingEstimate = MissingEstimate.LAST
    """What to do with jobs that have no runtime estimate: ``"last"`` or ``"error"``."""
    starvation_s: float | None = BLOX_STARVATION_S
    """Promote a job that waited this long in one stretch ahead of all others (None: never)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_missing", parse_missing(self.on_missing))
        check_starvation_s(self.starvation_s)

    def sort_key(self, job: JobState, now: float) -> tuple[int, float, float, int]:
        """(0 if starved else 1, remaining seconds or inf, submit time, seq); ascending is the ranking."""
        left = remaining_seconds(job)
        if left is None:
            if self.on_missing is MissingEstimate.ERROR:
                raise MissingEstimateError(self.name, [job.job_id])
            left = _UNKNOWN
        return (0 if starved(job, now, self.starvation_s) else 1, left, job.submit_time, job.seq)

    def key_stable_until(self, job: JobState, now: float) -> float:
        """A waiting job makes no progress, so its remaining time never changes: its key changes
        only when its starvation promotion comes due."""
        return starvation_due(job, now, self.starvation_s)

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        if self.on_missing is MissingEstimate.ERROR:
            missing = [j.job_id for j in jobs.values() if remaining_seconds(j) is None]
            if missing:
                raise MissingEstimateError(self.name, missing)
        keyed: list[tuple[int, float, float, int, str]] = []
        limit = self.starvation_s
        for job in jobs.values():  # sort_key, inlined: this loop runs over every job each round
            both = estimates(job)
            left = _UNKNOWN if both is None else both[0]
            keyed.append((0 if starved(job, now, limit) else 1, left, job.submit_time, job.seq, job.job_id))
        keyed.sort()
        return Ranking(order=tuple(k[4] for k in keyed))
