"""Node inventory and liveness, reported by each worker agent.

:class:`NodeRegister` is sent when an agent starts (and again whenever the scheduler asks for it
with :class:`NodeReregister`, ``node.reregister.<node>``);
it carries the GPUs as NVML sees them. :class:`NodeHeartbeat` is sent every few seconds on core NATS
and lists the leases the agent holds, so the scheduler can reconcile its view (a lease it granted
that the node does not report was lost; a lease the node reports that the scheduler revoked is stale)
and notice a dead node after ``lease_ttl`` (DESIGN, Leases and preemption).
"""

from __future__ import annotations

import enum
import uuid
from typing import Annotated, Final, TypeVar

from pydantic import Field, StringConstraints, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from schemas.base import Command, Event, WireModel
from schemas.fields import (
    MAX_GPUS_PER_NODE,
    Counter,
    Epoch,
    GpuIndex,
    GpuIndices,
    Host,
    Iteration,
    Labels,
    Seconds,
    ShortText,
    unique,
)
from schemas.ids import JobId, LeaseId, NodeId

__all__ = [
    "MAX_LEASES_PER_NODE",
    "GpuInventory",
    "GpuLink",
    "HeldLease",
    "LeaseState",
    "NodeHeartbeat",
    "NodeRegister",
    "NodeReregister",
    "ReregisterReason",
]

MAX_LEASES_PER_NODE: Final = 256
"""Bound on leases one node reports (more than its GPUs only when a policy packs jobs)."""

_GpuUuid = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_/-]*$")
]
_PciBusId = Annotated[
    str, StringConstraints(max_length=32, pattern=r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
]
_ComputeCapability = Annotated[str, StringConstraints(max_length=8, pattern=r"^[0-9]{1,2}\.[0-9]{1,2}$")]


T = TypeVar("T")
_Row = Annotated[list[T], Field(max_length=MAX_GPUS_PER_NODE)]
_Bandwidth = Annotated[float, Field(ge=0, le=100_000)]


class GpuInventory(WireModel):
    """One GPU as NVML reports it."""

    index: GpuIndex
    uuid: _GpuUuid = Field(description="NVML UUID, e.g. GPU-5f6c...; MIG devices start with MIG-.")
    name: ShortText = Field(description="Product name, e.g. 'NVIDIA H100 80GB HBM3'.")
    memory_mib: int = Field(ge=1, le=2**24, description="Total device memory in MiB.")
    compute_capability: _ComputeCapability | None = Field(default=None, description="e.g. '9.0'.")
    pci_bus_id: _PciBusId | None = Field(default=None, description="e.g. '00000000:1B:00.0'.")


class GpuLink(enum.StrEnum):
    """How two GPUs of a node talk, best first (``nvidia-smi topo -m`` levels)."""

    SELF = "self"
    NVLINK = "nvlink"
    PIX = "pix"
    """At most one PCIe switch between them."""
    PXB = "pxb"
    """Several PCIe switches, no host bridge."""
    PHB = "phb"
    """Through a PCIe host bridge (same CPU)."""
    NODE = "node"
    """Across host bridges within one NUMA node."""
    SYS = "sys"
    """Across NUMA nodes (SMP interconnect)."""


def _check_matrix(name: str, matrix: list[list[object]], info: ValidationInfo) -> None:
    gpus = info.data.get("gpus")
    if not isinstance(gpus, list):
        return  # gpus itself failed; that error is reported already
    n = len(gpus)
    if len(matrix) != n or any(len(row) != n for row in matrix):
        raise PydanticCustomError(
            "matrix_shape",
            "{name} must be a {n}x{n} matrix (one row and column per GPU)",
            {"name": name, "n": n},
        )
    for i in range(n):
        for j in range(i + 1, n):
            if matrix[i][j] != matrix[j][i]:
                raise PydanticCustomError(
                    "matrix_not_symmetric",
                    "{name}[{i}][{j}] differs from {name}[{j}][{i}]",
                    {"name": name, "i": i, "j": j},
                )


class NodeRegister(Event):
    """A worker agent announces its node and inventory (on start, and when asked to re-register)."""

    node_id: NodeId
    incarnation: uuid.UUID = Field(description="New on every agent start: tells a restart from a hiccup.")
    hostname: Host = Field(description="Where the node's processes are reachable (multi-node rendezvous).")
    cpus: float = Field(gt=0, le=4096, description="CPU cores the agent may hand out.")
    memory_gb: float = Field(gt=0, le=2**20, description="Host RAM in GiB the agent may hand out.")
    gpus: list[GpuInventory] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    links: list[_Row[GpuLink]] | None = Field(
        default=None, max_length=MAX_GPUS_PER_NODE, description="links[i][j]: how GPU i reaches GPU j."
    )
    link_bandwidth_gbps: list[_Row[_Bandwidth]] | None = Field(
        default=None,
        max_length=MAX_GPUS_PER_NODE,
        description="Gb/s (gigabits per second, one direction) between GPUs i and j (row and column order of "
        "gpus), if known; 0: unknown (the PCIe/host path).",
    )
    # > 0, unlike a matrix entry (where 0 means unknown): the round snapshot's ``SnapshotNode.network_gbps``
    # is > 0, so a 0 kept from a register would make every round's snapshot invalid at the placement.
    network_gbps: Annotated[float, Field(gt=0, le=100_000)] | None = Field(
        default=None, description="Gb/s of the node's link to its switch (its NIC), if known; None: not known."
    )
    labels: Labels = Field(default_factory=dict, description="e.g. rack, zone, instance type.")
    driver_version: ShortText | None = None
    cuda_version: ShortText | None = None
    agent_version: ShortText | None = None
    lease_ttl_s: Seconds | None = Field(
        default=None, description="The agent's lease TTL, so the scheduler can check it matches its own."
    )

    @field_validator("gpus")
    @classmethod
    def _distinct_indices(cls, gpus: list[GpuInventory]) -> list[GpuInventory]:
        unique([g.index for g in gpus])
        unique([g.uuid for g in gpus])
        return gpus

    @field_validator("links", "link_bandwidth_gbps")
    @classmethod
    def _square(cls, matrix: list[list[object]] | None, info: ValidationInfo) -> list[list[object]] | None:
        if matrix is not None:
            _check_matrix(info.field_name or "matrix", matrix, info)
        return matrix

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


class LeaseState(enum.StrEnum):
    """Where a lease is on its node."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    """Revoked: checkpointing within its grace period."""


class HeldLease(WireModel):
    """One lease a node holds, as reported in a heartbeat."""

    lease_id: LeaseId
    job_id: JobId
    epoch: Epoch
    gpus: GpuIndices
    state: LeaseState = LeaseState.RUNNING
    iteration: Iteration | None = None


class NodeHeartbeat(Event):
    """Liveness plus the leases the node holds now (core NATS, every few seconds)."""

    node_id: NodeId
    incarnation: uuid.UUID = Field(description="Must match the last NodeRegister; otherwise re-register.")
    seq: Counter = Field(description="Increases by one per heartbeat of this incarnation.")
    epoch_seen: Epoch = Field(description="Highest fencing epoch the node has accepted a command from.")
    leases: list[HeldLease] = Field(default_factory=list, max_length=MAX_LEASES_PER_NODE)
    draining: bool = Field(default=False, description="Accepts no new leases (maintenance, shutdown).")

    @field_validator("leases")
    @classmethod
    def _distinct_leases(cls, leases: list[HeldLease]) -> list[HeldLease]:
        unique([lease.lease_id for lease in leases])
        return leases

    @property
    def job_ids(self) -> tuple[str, ...]:
        """Jobs running (or stopping) on this node."""
        return tuple(lease.job_id for lease in self.leases)

    @property
    def lease_ids(self) -> tuple[str, ...]:
        return tuple(lease.lease_id for lease in self.leases)


class ReregisterReason(enum.StrEnum):
    """Why the scheduler asks a node to register again."""

    UNKNOWN_NODE = "unknown_node"
    """Its store has no registration of the node (restored from an older backup, a lost ``node.register``)."""
    OTHER_INCARNATION = "other_incarnation"
    """A heartbeat named an incarnation other than the one the store registered."""


class NodeReregister(Command):
    """Register again (``node.reregister.<node>``, core NATS, from the scheduler leader only).

    Sent when a heartbeat names a node or incarnation the scheduler does not know, at most once per
    node per few seconds. The agent answers with its current :class:`NodeRegister`; re-registering
    the same incarnation changes nothing, so a replayed or duplicated command is harmless.
    """

    node_id: NodeId
    reason: ReregisterReason
