"""Optimus (Peng et al., EuroSys '18, §4-5) as Blox reproduces it (Blox Table 7, ``schedulers/optimus.py``).

Two steps each round:

1. **Order by remaining time to convergence**, shortest first (Blox: "assign one GPU to each job
   in expected convergence order"). Remaining time comes from
   :func:`~services.scheduler.policies.estimates.remaining_seconds`, converted to the job's
   requested GPU count (below). Optimus fits a loss curve to predict convergence; Blox uses the
   declared iteration count instead, and so does this policy (``loss_target`` is left to the
   loss-based termination of Blox §5.3).
2. **Marginal-gain extra GPUs** (Optimus §4.1, "allocate to the job with the largest marginal
   gain"; Blox: "if GPUs still free then assign additional GPUs based on expected convergence
   speedups"). Walking the order, every job that fits gets its requested ``spec.gpus`` (rigid
   gang jobs cannot take less). The GPUs left over go one at a time to the elastic job
   (``spec.max_gpus`` set, below its cap) whose remaining time drops most from one more GPU,
   while that drop exceeds ``min_gain_s``. The resulting counts are returned in
   ``Ranking.gpu_targets`` (only where they differ from ``spec.gpus``).

Speed model (Optimus fits one per job from measured speeds; a policy has no profiles, so this is
the documented stand-in): Amdahl's law with a per-policy ``serial_fraction`` s. A job that needs
``R`` seconds on its requested ``g`` GPUs needs ``R * (s + (1 - s) * g / w)`` on ``w`` GPUs, so the
gain of the ``(w+1)``-th GPU is ``R * (1 - s) * g * (1/w - 1/(w+1))``: long jobs and narrow jobs gain
most, and every extra GPU is worth less than the one before. When the estimate came from a
measured iteration time while the job ran on ``w != g`` GPUs, ``R`` is first scaled back to ``g``.

Starvation: Blox's promotion (``services.scheduler.policies.starvation``; Blox's Optimus sorts by
``job_priority`` first): a job that has waited ``starvation_s`` (default Blox's 1000 h) in one stretch
ranks ahead of every job that has not, for good. ``None`` disables it (pure Optimus order, which can
starve long jobs for ever under load).

Ties break by submit time, then ``seq`` (order) and by rank position (extra GPUs). Jobs without an
estimate rank last in submit order (or raise, with ``on_missing="error"``) and get no extras.
No ``sort_key`` fast path: the ranking carries ``gpu_targets``, which a bare sort cannot express.
"""

from __future__ import annotations

import heapq
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
    parse_missing,
    remaining_seconds,
)
from services.scheduler.policies.starvation import BLOX_STARVATION_S, check_starvation_s, starved

_UNKNOWN = float("inf")


@SCHEDULING.register("optimus")
@dataclass(frozen=True, kw_only=True, slots=True)
class OptimusPolicy:
    """Remaining-time order plus marginal-gain GPU counts for elastic jobs."""

    name: ClassVar[str] = "optimus"
    triggers: ClassVar[Trigger] = Trigger.TIMER
    preemptive: ClassVar[bool] = True

    serial_fraction: float = 0.1
    """Amdahl serial fraction s of the speed model, in [0, 1)."""
    min_gain_s: float = 0.0
    """An extra GPU is granted only if it cuts the job's remaining time by more than this."""
    on_missing: MissingEstimate = MissingEstimate.LAST
    """What to do with jobs that have no runtime estimate: ``"last"`` or ``"error"``."""
    starvation_s: float | None = BLOX_STARVATION_S
    """Promote a job that waited this long in one stretch ahead of all others (None: never)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.serial_fraction < 1.0:
            raise ValueError(f"serial_fraction must be in [0, 1), got {self.serial_fraction}")
        if self.min_gain_s < 0:
            raise ValueError(f"min_gain_s must be >= 0, got {self.min_gain_s}")
        object.__setattr__(self, "on_missing", parse_missing(self.on_missing))
        check_starvation_s(self.starvation_s)

    def time_factor(self, requested: int, gpus: int) -> float:
        """Run time on ``gpus`` GPUs relative to the run time on the ``requested`` count."""
        s = self.serial_fraction
        return s + (1.0 - s) * requested / gpus

    def remaining_at_request(self, job: JobState) -> float | None:
        """Remaining seconds on the job's requested GPU count, or None when unknown."""
        left = remaining_seconds(job)
        if left is None:
            return None
        spec = job.spec
        held = len(job.gpus)
        measured = spec.expected_iterations is not None and job.iteration_time_s is not None
        if measured and job.is_running and held and held != spec.gpus:
            return left / self.time_factor(spec.gpus, held)
        return left

    def marginal_gain(self, remaining: float, requested: int, gpus: int) -> float:
        """Seconds of remaining time saved by going from ``gpus`` to ``gpus + 1`` GPUs."""
        return remaining * (self.time_factor(requested, gpus) - self.time_factor(requested, gpus + 1))

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        keyed: list[tuple[int, float, float, int, str]] = []
        remaining: dict[str, float] = {}
        limit = self.starvation_s
        for job in jobs.values():
            left = self.remaining_at_request(job)
            if left is not None:
                remaining[job.job_id] = left
            first = 0 if starved(job, now, limit) else 1
            keyed.append((first, _UNKNOWN if left is None else left, job.submit_time, job.seq, job.job_id))
        if self.on_missing is MissingEstimate.ERROR and len(remaining) < len(keyed):
            raise MissingEstimateError(self.name, [k[4] for k in keyed if k[1] == _UNKNOWN])
        keyed.sort()
        order = tuple(k[4] for k in keyed)
        return Ranking(order=order, gpu_targets=self._extra_gpus(order, jobs, remaining, cluster.total_gpus))

    def _extra_gpus(
        self, order: tuple[str, ...], jobs: Mapping[str, JobState], remaining: dict[str, float], capacity: int
    ) -> dict[str, int]:
        free = capacity
        heap: list[tuple[float, int, int, str]] = []
        for position, job_id in enumerate(order):
            if free <= 0:
                break
            spec = jobs[job_id].spec
            if spec.gpus > free:
                continue
            free -= spec.gpus
            left = remaining.get(job_id)
            if spec.max_gpus is not None and spec.max_gpus > spec.gpus and left:
                gain = self.marginal_gain(left, spec.gpus, spec.gpus)
                heapq.heappush(heap, (-gain, position, spec.gpus, job_id))
        targets: dict[str, int] = {}
        while free > 0 and heap:
            neg_gain, position, gpus, job_id = heapq.heappop(heap)
            if -neg_gain <= self.min_gain_s:
                break
            gpus += 1
            free -= 1
            targets[job_id] = gpus
            spec = jobs[job_id].spec
            if spec.max_gpus is not None and gpus < spec.max_gpus:
                gain = self.marginal_gain(remaining[job_id], spec.gpus, gpus)
                heapq.heappush(heap, (-gain, position, gpus, job_id))
        return targets
