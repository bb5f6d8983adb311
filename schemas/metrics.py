"""Metrics: what a training job and a node report, on core NATS (lossy by design, high rate).

``metrics.job.<job>`` carries a job's progress (iteration, loss, speed), which loss-aware and
throughput-aware policies read (Blox §5.3, Optimus, Pollux); ``metrics.node.<node>`` carries per-GPU
utilization and memory from NVML for the dashboards and the utilization figure.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, StringConstraints, field_validator

from schemas.base import Event, WireModel
from schemas.fields import MAX_GPUS_PER_NODE, GpuIndex, Iteration, Seconds, unique
from schemas.ids import JobId, LeaseId, NodeId

__all__ = ["MAX_EXTRA_METRICS", "GpuSample", "JobMetrics", "NodeMetrics"]

MAX_EXTRA_METRICS: Final = 32

_MetricKey = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.:/-]*$")
]
_MetricValue = Annotated[float, Field(ge=-1e30, le=1e30)]


class JobMetrics(Event):
    """A training job's progress, pushed in the background by ``roundhouse.train``."""

    job_id: JobId
    lease_id: LeaseId | None = None
    rank: int | None = Field(default=None, ge=0, lt=1024, description="Reporting process's global rank.")
    iteration: Iteration
    loss: _MetricValue | None = None
    iteration_time_s: float | None = Field(
        default=None, gt=0, le=10**6, description="Recent mean s/iteration."
    )
    throughput: float | None = Field(default=None, ge=0, le=1e12, description="Samples per second.")
    batch_size: int | None = Field(default=None, ge=1, le=2**31)
    grad_noise_scale: float | None = Field(
        default=None,
        ge=0,
        le=1e12,
        allow_inf_nan=False,
        description="Gradient noise scale in examples (McCandlish et al.'s B_simple), for Pollux's goodput.",
    )
    extra: dict[_MetricKey, _MetricValue] = Field(
        default_factory=dict, max_length=MAX_EXTRA_METRICS, description="Other scalars (accuracy, lr, ...)."
    )


class GpuSample(WireModel):
    """One GPU's NVML readings."""

    index: GpuIndex
    utilization_pct: float = Field(ge=0, le=100)
    memory_used_mib: int = Field(ge=0, le=2**24)
    memory_total_mib: int | None = Field(default=None, ge=1, le=2**24)
    temperature_c: float | None = Field(default=None, ge=-50, le=200)
    power_w: float | None = Field(default=None, ge=0, le=10_000)


class NodeMetrics(Event):
    """A node's GPU (and host) readings, sampled by the worker agent."""

    node_id: NodeId
    gpus: list[GpuSample] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    cpu_utilization_pct: float | None = Field(default=None, ge=0, le=100)
    memory_used_gb: float | None = Field(default=None, ge=0, le=2**20)
    interval_s: Seconds | None = Field(default=None, description="Sampling period the readings average over.")

    @field_validator("gpus")
    @classmethod
    def _distinct(cls, gpus: list[GpuSample]) -> list[GpuSample]:
        unique([g.index for g in gpus])
        return gpus
