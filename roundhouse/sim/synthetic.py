"""Synthetic workload generators, each seeded per random stream.

Every quantity (arrivals, durations, GPU counts, models, classes, grace periods) draws from its own
``random.Random`` seeded with ``"<seed>:<stream>"``, so adding a stream, or drawing one more value
from one, never shifts the others: the same seed gives the same arrivals whatever else changes.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from roundhouse.sim.workload import TraceJob, WorkloadError
from schemas.job import JobClass

BLOX_MODELS: tuple[str, ...] = ("resnet18", "cyclegan", "resnet50", "lstm", "recoder", "transformer", "a3c")
"""Blox Table 2: the models Blox assigns at random to Philly-trace jobs."""

GAVEL_GPU_COUNTS: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
"""Blox's ``get_job_gpu_demand`` (after Gavel): P(1)=0.7, P(2)=0.1, P(4)=0.15, P(8)=0.05."""


def stream(seed: int, name: str) -> random.Random:
    """An independent generator for one named stream of one seed (stable across Python runs)."""
    return random.Random(f"{seed}:{name}")


class GpuCounts:
    """A discrete distribution of GPUs per job, sampled by inverse CDF."""

    def __init__(self, weights: Sequence[tuple[int, float]], label: str) -> None:
        total = sum(w for _, w in weights)
        if not weights or total <= 0:
            raise WorkloadError(f"GPU count distribution {label!r} is empty")
        self.label = label
        self.values = [v for v, _ in weights]
        acc = 0.0
        self.cdf: list[float] = []
        for _, w in weights:
            acc += w / total
            self.cdf.append(acc)
        self.cdf[-1] = 1.0
        self.mean = sum(v * w for v, w in weights) / total

    def sample(self, rng: random.Random) -> int:
        u = rng.random()
        for value, edge in zip(self.values, self.cdf, strict=True):
            if u < edge:
                return value
        return self.values[-1]

    @classmethod
    def single(cls) -> GpuCounts:
        return cls(((1, 1.0),), "1")

    @classmethod
    def gavel(cls) -> GpuCounts:
        return cls(GAVEL_GPU_COUNTS, "gavel")

    @classmethod
    def from_philly(cls, trace: Path) -> GpuCounts:
        """The empirical ``num_gpus`` distribution of ``philly-pollux.csv``."""
        from roundhouse.sim.traces import read_philly_gpu_counts

        counts = Counter(read_philly_gpu_counts(trace))
        return cls(sorted((g, float(n)) for g, n in counts.items()), "philly")


@dataclass(frozen=True, slots=True)
class PhillySynthetic:
    """Blox's Philly-derived synthetic workload (Blox §4, "Philly-Trace"; its ``jobs/workload.py``).

    * arrivals: Poisson at ``jobs_per_hour``; inter-arrival ``ceil(-ln(1-U) / lambda)`` hours, in
      whole seconds, as Blox's ``poisson_next_arrival_time`` computes it; the first job arrives one
      inter-arrival after t=0;
    * durations (Blox ``get_gavel_like_iter``, after Gavel): with probability 0.8,
      ``60 * 10**U(1.5, 3)`` s, else ``60 * 10**U(3, 4)`` s;
    * GPUs: 1 per job (Blox's default), or drawn from the Philly trace's GPU counts, or Gavel's
      {1, 2, 4, 8} distribution;
    * model: uniform over Blox Table 2; class: BE; user: ``default``.

    Infinite unless ``num_jobs`` is set: the simulator stops once the tracked jobs are done.
    """

    jobs_per_hour: float
    seed: int = 0
    gpu_counts: GpuCounts | None = None
    num_jobs: int | None = None

    def __post_init__(self) -> None:
        if not self.jobs_per_hour > 0:
            raise WorkloadError(f"jobs per hour must be positive, got {self.jobs_per_hour}")

    def __iter__(self) -> Iterator[TraceJob]:
        arrivals = stream(self.seed, "arrivals")
        durations = stream(self.seed, "durations")
        gpus_rng = stream(self.seed, "gpus")
        models = stream(self.seed, "models")
        counts = self.gpu_counts or GpuCounts.single()
        rate = self.jobs_per_hour
        now = 0.0
        indexes = count() if self.num_jobs is None else iter(range(self.num_jobs))
        for index in indexes:
            now += math.ceil(-math.log(1.0 - arrivals.random()) / rate * 3600.0)
            if durations.random() >= 0.8:
                duration = 60.0 * 10 ** durations.uniform(3.0, 4.0)
            else:
                duration = 60.0 * 10 ** durations.uniform(1.5, 3.0)
            yield TraceJob(
                index=index,
                arrival_s=now,
                gpus=counts.sample(gpus_rng),
                duration_s=duration,
                model=models.choice(BLOX_MODELS),
            )


def _truncated_normal(rng: random.Random, mean: float, sigma: float, low: float, high: float) -> float:
    """A normal draw restricted to [low, high] by rejection (FitGpp Appendix A's "truncated")."""
    for _ in range(10_000):
        x = rng.gauss(mean, sigma)
        if low <= x <= high:
            return x
    raise WorkloadError(f"cannot draw from N({mean}, {sigma}) truncated to [{low}, {high}]")


@dataclass(frozen=True, slots=True)
class ClassShape:
    """Truncated-normal shape of one FitGpp job class."""

    duration_mean_s: float
    duration_sigma_s: float
    duration_max_s: float
    gpus_mean: float
    gpus_sigma: float


FITGPP_TE = ClassShape(300.0, 600.0, 1800.0, 1.0, 1.0)
FITGPP_BE = ClassShape(1800.0, 3.0 * 3600.0, 24 * 3600.0, 2.0, 2.0)


@dataclass(frozen=True, slots=True)
class FitGppSynthetic:
    """FitGpp's synthetic workload (FitGpp §3 and Appendix A).

    From the paper: 30% TE jobs; execution times from normal distributions with means 5 min (TE)
    and 30 min (BE), truncated at 30 min and 24 h; grace periods N(3 min, .) truncated at 20 min;
    jobs submitted so that the cluster load would be 2.0 under FIFO; single-task (one-node) jobs.
    The paper does not publish the spreads nor the GPU-count fits, so these are Roundhouse's
    assumptions: duration sigma 10 min (TE) and 3 h (BE), lower truncation at 1 s; GPUs
    N(1, 1) (TE) and N(2, 2) (BE), rounded and truncated to [1, ``max_gpus``]; grace sigma 1 min,
    lower truncation 5 s. "Load 2.0" is read as offered load: Poisson arrivals at
    ``load * total_gpus / E[gpus * duration]``, the expectation estimated from 20,000 draws of a
    dedicated stream.
    """

    total_gpus: int
    load: float = 2.0
    num_jobs: int = 2**19
    te_fraction: float = 0.3
    max_gpus: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.load > 0 or self.total_gpus < 1 or self.num_jobs < 1:
            raise WorkloadError("fitgpp-synthetic needs load > 0, total_gpus >= 1 and num_jobs >= 1")

    def _draw(self, rng: random.Random, te: bool) -> tuple[float, int]:
        shape = FITGPP_TE if te else FITGPP_BE
        duration = _truncated_normal(rng, shape.duration_mean_s, shape.duration_sigma_s, 1.0, shape.duration_max_s)
        gpus = round(_truncated_normal(rng, shape.gpus_mean, shape.gpus_sigma, 0.5, self.max_gpus + 0.49))
        return duration, max(1, min(self.max_gpus, gpus))

    def mean_gpu_seconds(self) -> float:
        rng = stream(self.seed, "calibration")
        total = 0.0
        n = 20_000
        for _ in range(n):
            duration, gpus = self._draw(rng, rng.random() < self.te_fraction)
            total += duration * gpus
        return total / n

    def __iter__(self) -> Iterator[TraceJob]:
        rate_per_s = self.load * self.total_gpus / self.mean_gpu_seconds()
        arrivals = stream(self.seed, "arrivals")
        classes = stream(self.seed, "classes")
        shapes = stream(self.seed, "shapes")
        grace = stream(self.seed, "grace")
        now = 0.0
        for index in range(self.num_jobs):
            now += arrivals.expovariate(rate_per_s)
            te = classes.random() < self.te_fraction
            duration, gpus = self._draw(shapes, te)
            yield TraceJob(
                index=index,
                arrival_s=now,
                gpus=gpus,
                duration_s=duration,
                job_class=JobClass.TE if te else JobClass.BE,
                checkpoint_s=_truncated_normal(grace, 180.0, 60.0, 5.0, 1200.0),
            )
