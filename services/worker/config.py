"""The worker agent's settings (``roundhouse service worker --fake-gpus 4 ...`` derives its flags here)."""

from __future__ import annotations

import re
import socket

from pydantic import Field, field_validator, model_validator

from schemas.ids import TOKEN_PATTERN
from services.runtime.config import ServiceConfig
from services.worker.links import check_link_spec
from services.worker.orphans import check_timing

__all__ = ["WorkerConfig", "default_node_id"]


def default_node_id() -> str:
    """The short host name made into a subject token (``gpu-box.example.com`` -> ``gpu-box``)."""
    short = socket.gethostname().split(".", 1)[0]
    token = re.sub(r"[^A-Za-z0-9_-]", "-", short).strip("-_") or "node"
    return token[:64]


class WorkerConfig(ServiceConfig):
    """Settings of one worker agent (one per node)."""

    node_id: str = Field(default_factory=default_node_id, pattern=TOKEN_PATTERN, max_length=64,
                         description="Stable id of this node (a subject token); default: short host name.")
    host: str = Field(default="127.0.0.1", description="Address other nodes reach this node's processes at.")
    fake_gpus: int = Field(default=0, ge=0, le=64, description="Pretend to have N GPUs (0: ask NVML).")
    fake_gpu_name: str = Field(
        default="Roundhouse Fake GPU", min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$",
        description="Product name the fake GPUs report, e.g. 'Tesla V100-SXM2-16GB': the node's GPU type "
        "(normalised by the scheduler, services.core.heterogeneity). Real GPUs report NVML's.",
    )
    lease_ttl_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="Cut off from the bus half this long, the agent stops its jobs (done within it); a job "
        "whose agent is gone is stopped within it too; must equal the scheduler's.",
    )
    heartbeat_s: float = Field(default=2.0, gt=0, le=600, description="Heartbeat (and bus liveness check) period.")
    metrics_s: float = Field(default=1.0, gt=0, le=600, description="Job and node metrics publishing period.")
    kill_after_s: float = Field(default=5.0, ge=0, le=600,
                                description="After the grace period: SIGTERM, then SIGKILL this much later.")
    work_dir: str = Field(default=".roundhouse/worker", description="Channels, logs and checkpoints live here.")
    checkpoint_root: str | None = Field(
        default=None, description="Checkpoints go to <root>/<job id>; default <work_dir>/checkpoints."
    )
    cpus: float | None = Field(default=None, gt=0, description="CPU cores to offer; default: all.")
    memory_gb: float | None = Field(default=None, gt=0, description="Host RAM (GiB) to offer; default: all.")
    emulate: bool = Field(default=False, description="Emulate job progress on a scaled clock; launch nothing.")
    speedup: float = Field(default=1.0, gt=0, le=1e6, description="Emulation clock speed-up.")
    emulate_iteration_s: float = Field(default=0.5, gt=0,
                                       description="Emulated seconds per iteration (before speed-up).")
    emulate_checkpoint_s: float = Field(default=10.0, ge=0,
                                        description="Emulated checkpoint cost on a revoke (before speed-up).")
    link_bandwidth_gbps: str | None = Field(
        default=None, max_length=4096,
        description="Gb/s between this node's GPUs: a server profile (p3.8xlarge, dgx-a100, ...) or pairs "
        "'0-1=400,2-3=400'; default: NVML's NVLink topology (none for fake GPUs).",
    )
    network_gbps: float | None = Field(default=None, gt=0, le=100_000,
                                       description="Gb/s of this node's uplink to its switch, if known.")

    @field_validator("link_bandwidth_gbps")
    @classmethod
    def _link_spec(cls, spec: str | None) -> str | None:
        return None if spec is None else check_link_spec(spec)

    @model_validator(mode="after")
    def _jobs_stop_before_the_ttl(self) -> WorkerConfig:
        """A job whose agent died or went silent must be able to stop before the scheduler reassigns
        its GPUs (``services.worker.orphans``): ``heartbeat_s`` must leave room under ``lease_ttl_s``."""
        check_timing(lease_ttl_s=self.lease_ttl_s, heartbeat_s=self.heartbeat_s)
        return self
