"""What the simulator replays: a stream of ``TraceJob`` records in arrival order.

A workload is any iterable of ``TraceJob`` sorted by ``arrival_s`` (generators may be infinite; the
simulator stops when the tracked jobs are done). Records are small slotted objects; the simulator
turns one into a ``JobState`` only when the job arrives, so a million-job trace never sits in memory
as policy-facing state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from schemas.job import JobClass
from services.core.goodput import profile_for
from services.core.simulation.loss import LossCurve


class WorkloadError(ValueError):
    """A workload (trace file or generator option) is malformed; the message says where and why."""


@dataclass(slots=True)
class TraceJob:
    """One job of a workload.

    Treat it as immutable (it is not frozen only because frozen dataclasses are slow to build, and
    workloads create millions). ``duration_s`` is the job's run time when it runs alone on ``gpus``
    GPUs placed as compactly as possible (the quantity traces record); the simulator derives slower
    rates from it.
    """

    index: int
    """Position in arrival order, from 0; the job id and the unit of ``--track``."""
    arrival_s: float
    gpus: int
    duration_s: float
    job_class: JobClass = JobClass.BE
    user: str = "default"
    model: str | None = None
    iterations: int | None = None
    checkpoint_s: float | None = None
    """Time to suspend this job (its grace period), overriding the cost model's per-model value."""
    cpus: float | None = None
    """CPU cores the job needs (FitGpp's demand vector); None keeps ``JobSpec``'s default."""
    memory_gb: float | None = None
    """Host RAM in GiB the job needs; None keeps ``JobSpec``'s default."""
    loss_curve: LossCurve | None = None
    """The job's loss as a function of its progress (``services.core.simulation.loss``); None: it reports none."""
    loss_target: float | None = None
    """The user's target loss (``JobSpec.loss_target``: Blox §5.3 termination, Hermes' goal)."""
    max_gpus: int | None = None
    """Elastic jobs: the most GPUs it can use (``JobSpec.max_gpus``; Optimus and Gandiva's grow-shrink
    give it more than ``gpus`` when they are free); None: rigid. ``duration_s`` stays its run time on
    ``gpus`` GPUs, the cost model scales it for other counts."""
    goodput: bool = False
    """Pollux's adaptive-batch jobs: progress is the goodput of the model's profile
    (``services.core.simulation.goodput_jobs``; ``duration_s`` is then its run time on one GPU).
    False (the default): the cost model's scaling."""
    gpu_throughputs: Mapping[str, float] | None = None
    """Relative speed per GPU type (``JobSpec.gpu_throughputs``; ``services.core.heterogeneity``);
    None: looked up from ``model``. Used only when the simulator's heterogeneity model is on."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise WorkloadError(f"job {self.index}: needs at least 1 GPU, got {self.gpus}")
        if not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise WorkloadError(f"job {self.index}: duration must be a positive number, got {self.duration_s}")
        if not (self.arrival_s >= 0 and math.isfinite(self.arrival_s)):
            raise WorkloadError(f"job {self.index}: arrival must be >= 0, got {self.arrival_s}")
        if self.goodput and profile_for(self.model) is None:
            raise WorkloadError(f"job {self.index}: no goodput profile for model {self.model!r}")
        if self.max_gpus is not None and self.max_gpus < self.gpus:
            raise WorkloadError(f"job {self.index}: max_gpus ({self.max_gpus}) must be >= gpus ({self.gpus})")
        if self.iterations is not None and self.iterations < 1:
            raise WorkloadError(f"job {self.index}: iterations must be >= 1, got {self.iterations}")
        if self.loss_target is not None and not math.isfinite(self.loss_target):
            raise WorkloadError(f"job {self.index}: loss_target must be a finite number, got {self.loss_target}")
        for name in ("cpus", "memory_gb"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise WorkloadError(f"job {self.index}: {name} must be a positive number, got {value}")

    @property
    def job_id(self) -> str:
        return str(self.index)


def checked_in_order(jobs: Iterable[TraceJob]) -> Iterator[TraceJob]:
    """Pass ``jobs`` through, failing if arrivals go backwards or indexes are not 0, 1, 2, ..."""
    last = -math.inf
    for expected, job in enumerate(jobs):
        if job.index != expected:
            raise WorkloadError(f"job indexes must count up from 0: got {job.index} at position {expected}")
        if job.arrival_s < last:
            raise WorkloadError(f"job {job.index}: arrival {job.arrival_s} is before the previous {last}")
        last = job.arrival_s
        yield job
