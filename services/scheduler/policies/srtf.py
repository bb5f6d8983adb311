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
* Triggers: timer and churn, since an arrival or a completion can change who is shortest.
* Fast path: ``sort_key``/``key_stable_until`` (a waiting job's key never changes), so owners can
  keep the order incrementally. With ``on_missing="error"``, ``sort_key`` raises too.
"""

from __future__ import annotations

import math
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_missing", parse_missing(self.on_missing))

    def sort_key(self, job: JobState, now: float) -> tuple[float, float, int]:
        """(remaining seconds or inf, submit time, seq); ascending is the ranking."""
        left = remaining_seconds(job)
        if left is None:
            if self.on_missing is MissingEstimate.ERROR:
                raise MissingEstimateError(self.name, [job.job_id])
            left = _UNKNOWN
        return (left, job.submit_time, job.seq)

    def key_stable_until(self, job: JobState, now: float) -> float:
        """A waiting job makes no progress, so its remaining time (its key) never changes."""
        return math.inf

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        if self.on_missing is MissingEstimate.ERROR:
            missing = [j.job_id for j in jobs.values() if remaining_seconds(j) is None]
            if missing:
                raise MissingEstimateError(self.name, missing)
        keyed: list[tuple[float, float, int, str]] = []
        for job in jobs.values():  # sort_key, inlined: this loop runs over every job each round
            both = estimates(job)
            keyed.append((_UNKNOWN if both is None else both[0], job.submit_time, job.seq, job.job_id))
        keyed.sort()
        return Ranking(order=tuple(k[3] for k in keyed))
