"""Bursty workloads: extra jobs arriving in recurring windows, merged into a base stream.

Blox uses two such variants of its Philly-derived workload (``PhillySynthetic``):

* §5.1 ("Handling workload spikes", Fig. 13): "using the same Philly-Trace with an arrival rate of
  8 jobs/hour, we inject an additional 16 jobs during one hour in each day" -> :func:`daily_spike`.
* §5.2 (the synthesizer's "bursty Philly-Trace derived workload"): "we send two times the load of
  short jobs (runtime chosen randomly between ten minutes and one hour) for two consecutive hours
  after every four hours" -> build :class:`Spikes` with ``rate_per_hour`` and ``duration_range_s``.

:func:`with_spikes` merges a base stream (any workload sorted by arrival) with the jobs of a
:class:`Spikes` description and re-indexes the merged stream 0, 1, 2, ... in arrival order, so
``--track 3000:4000`` counts spike jobs like any other (they are part of the load a tracked job
sees). On equal arrival times the base job comes first. Spike jobs are drawn only while the base
stream lasts: the merged stream ends with the base stream (the last spike jobs yielded arrive no
later than the last base job), so a finite base stays finite and an endless one stays endless.

Every random quantity of the spike jobs draws from its own stream, ``"<seed>:spike-<name>"``
(:func:`roundhouse.sim.synthetic.stream`), never from the base workload's streams: adding spikes to
a run leaves every base job (arrival, duration, GPUs, model) exactly as it was without them, so
"with spike" vs "without spike" compares the same base jobs.

Choices where Blox is silent, and why:

* **Where in the day the spike falls**: at a fixed offset in each period (``offset_s``; default
  for :func:`daily_spike` 12 h, i.e. midday of every simulated day, the first spike 12 h after
  t=0). A fixed hour is what "one hour in each day" suggests (a daily peak), and it keeps the spike
  pattern independent of the seed; the offset is an option.
* **Arrival times inside a window**: with ``jobs_per_window`` (Blox §5.1's "16 jobs"), exactly
  that many arrivals, each uniform over the window, sorted; with ``rate_per_hour`` (§5.2's "two
  times the load"), a Poisson process at that rate restarted at each window start. Either way in
  whole seconds, as ``PhillySynthetic`` draws its arrivals.
* **What the spike jobs are**: the §5.1 spike is described only by its count, so its jobs follow
  the Philly-synthetic shape (durations ``60*10**U(1.5,3)`` s w.p. 0.8 else ``60*10**U(3,4)`` s,
  the same GPU-count distribution as the base, models uniform over Blox Table 2): the spike adds
  load of the same mix rather than a different kind of job. §5.2 says its burst jobs are short,
  "runtime chosen randomly between ten minutes and one hour": ``duration_range_s=(600, 3600)``
  draws them uniformly in that range.
* **Owner**: spike jobs carry ``user`` (default ``"default"``, the base jobs' user), so per-user
  policies see them as the same tenant unless asked otherwise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import count

from roundhouse.sim.synthetic import BLOX_MODELS, GpuCounts, philly_duration_s, poisson_gap_s, stream
from services.core.simulation.workload import TraceJob, WorkloadError

DAY_S = 86_400.0
HOUR_S = 3_600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Spikes:
    """Recurring windows of extra arrivals: one window of ``window_s`` per ``period_s``.

    The window of period ``k`` covers ``[k*period_s + offset_s, k*period_s + offset_s + window_s)``.
    Exactly one of ``jobs_per_window`` (a fixed count, uniform over the window) and
    ``rate_per_hour`` (Poisson arrivals inside the window) is set.
    """

    period_s: float = DAY_S
    window_s: float = HOUR_S
    offset_s: float = 12 * HOUR_S
    jobs_per_window: int | None = None
    rate_per_hour: float | None = None
    duration_range_s: tuple[float, float] | None = None
    """Uniform durations in ``[low, high]`` seconds; None draws Philly-synthetic durations."""
    gpu_counts: GpuCounts | None = None
    """GPUs per spike job; None is one GPU (``PhillySynthetic``'s default)."""
    user: str = "default"

    def __post_init__(self) -> None:
        if not (self.period_s > 0 and math.isfinite(self.period_s)):
            raise WorkloadError(f"spike period must be a positive number of seconds, got {self.period_s}")
        if not 0 < self.window_s <= self.period_s:
            raise WorkloadError(f"spike window must be in (0, period], got {self.window_s} for {self.period_s}")
        if not 0 <= self.offset_s <= self.period_s - self.window_s:
            raise WorkloadError(
                f"spike offset must keep the window inside its period: 0 <= {self.offset_s} <= "
                f"{self.period_s - self.window_s}"
            )
        if (self.jobs_per_window is None) == (self.rate_per_hour is None):
            raise WorkloadError("give exactly one of jobs_per_window and rate_per_hour")
        if self.jobs_per_window is not None and self.jobs_per_window < 0:
            raise WorkloadError(f"jobs per window must be >= 0, got {self.jobs_per_window}")
        if self.rate_per_hour is not None and not (self.rate_per_hour > 0 and math.isfinite(self.rate_per_hour)):
            raise WorkloadError(f"spike rate must be a positive number of jobs per hour, got {self.rate_per_hour}")
        if self.duration_range_s is not None:
            low, high = self.duration_range_s
            if not (0 < low <= high and math.isfinite(high)):
                raise WorkloadError(f"spike durations must satisfy 0 < low <= high, got {self.duration_range_s}")

    def arrivals(self, seed: int) -> Iterator[float]:
        """Spike arrival times in order, endless (whole seconds)."""
        rng = stream(seed, "spike-arrivals")
        if self.jobs_per_window == 0:
            return
        for period in count():
            start = period * self.period_s + self.offset_s
            end = start + self.window_s
            if self.jobs_per_window is not None:
                times = sorted(math.floor(start + rng.random() * self.window_s) for _ in range(self.jobs_per_window))
                yield from (max(start, t) for t in times)
            else:
                assert self.rate_per_hour is not None
                now = start
                while True:
                    now += poisson_gap_s(rng, self.rate_per_hour)
                    if now >= end:
                        break
                    yield now

    def jobs(self, seed: int) -> Iterator[TraceJob]:
        """Spike jobs in arrival order, endless (unless ``jobs_per_window`` is 0); every ``index`` is 0,
        to be set by :func:`with_spikes` when it merges them into a base stream."""
        durations = stream(seed, "spike-durations")
        gpus_rng = stream(seed, "spike-gpus")
        models = stream(seed, "spike-models")
        counts = self.gpu_counts or GpuCounts.single()
        for arrival in self.arrivals(seed):
            yield TraceJob(
                index=0,
                arrival_s=arrival,
                gpus=counts.sample(gpus_rng),
                duration_s=self._duration(durations),
                model=models.choice(BLOX_MODELS),
                user=self.user,
            )

    def _duration(self, rng: random.Random) -> float:
        if self.duration_range_s is not None:
            return rng.uniform(*self.duration_range_s)
        return philly_duration_s(rng)


def daily_spike(*, jobs: int = 16, offset_s: float = 12 * HOUR_S, gpu_counts: GpuCounts | None = None) -> Spikes:
    """Blox §5.1's spike: ``jobs`` extra Philly-synthetic jobs within one hour, once a day."""
    return Spikes(period_s=DAY_S, window_s=HOUR_S, offset_s=offset_s, jobs_per_window=jobs, gpu_counts=gpu_counts)


def with_spikes(base: Iterable[TraceJob], spikes: Spikes, *, seed: int = 0) -> Iterator[TraceJob]:
    """``base`` merged with ``spikes``' jobs in arrival order, re-indexed from 0 (see the module doc)."""
    extra = spikes.jobs(seed)
    pending = next(extra, None)
    index = 0
    for job in base:
        while pending is not None and pending.arrival_s < job.arrival_s:
            yield replace(pending, index=index)
            index += 1
            pending = next(extra, None)
        yield job if job.index == index else replace(job, index=index)
        index += 1


@dataclass(frozen=True, slots=True)
class SpikedWorkload:
    """A re-iterable :func:`with_spikes` (each iteration restarts both streams from the seed)."""

    base: Iterable[TraceJob]
    spikes: Spikes
    seed: int = 0

    def __iter__(self) -> Iterator[TraceJob]:
        return with_spikes(self.base, self.spikes, seed=self.seed)


__all__ = ["DAY_S", "HOUR_S", "SpikedWorkload", "Spikes", "daily_spike", "with_spikes"]
