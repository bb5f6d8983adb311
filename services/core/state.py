"""Policy-facing views of jobs and of the cluster (after Blox §6.4, JobState and ClusterState).

The owner of the state (the scheduler service, or the simulator) mutates these objects between
rounds; policies receive them read-only by contract and must never mutate them (tests check this in
debug mode). They are plain slotted dataclasses rather than pydantic models because the simulator
holds hundreds of thousands of them and touches them on every event.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from schemas.job import JobClass, JobSpec


class JobStatus(enum.StrEnum):
    HELD = "held"  # admission has not let it in yet
    QUEUED = "queued"  # admitted, waiting for GPUs (never ran, or suspended and holding none)
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.REJECTED})


@dataclass(slots=True)
class JobState:
    """Everything a policy may know about one job. Times are on the caller's clock (``now``)."""

    job_id: str
    spec: JobSpec
    submit_time: float
    status: JobStatus = JobStatus.QUEUED
    admit_time: float | None = None
    first_start_time: float | None = None
    last_start_time: float | None = None
    last_preempt_time: float | None = None
    finish_time: float | None = None
    attained_service: float = 0.0
    """GPU-seconds received so far (LAS, Tiresias)."""
    executed_time: float = 0.0
    """Wall seconds spent running so far, whatever the GPU count."""
    iterations_done: int = 0
    preemptions: int = 0
    gpus: tuple[int, ...] = ()
    """Global GPU ids held now; empty unless RUNNING."""
    loss: float | None = None
    """Most recent reported loss."""
    loss_history: list[tuple[float, float]] = field(default_factory=list)
    """(time, loss) samples, oldest first; bounded by the owner."""
    iteration_time_s: float | None = None
    """Recent average seconds per iteration at the current GPU count."""

    @property
    def job_class(self) -> JobClass:
        return self.spec.job_class

    @property
    def gpus_requested(self) -> int:
        return self.spec.gpus

    @property
    def is_running(self) -> bool:
        return self.status is JobStatus.RUNNING

    @property
    def is_waiting(self) -> bool:
        return self.status is JobStatus.QUEUED


@dataclass(frozen=True, slots=True)
class Gpu:
    gpu_id: int
    """Global id, dense from 0: index into ClusterState.gpus."""
    node_id: str
    local_index: int
    gpu_type: str = "generic"
    memory_mb: int = 16_384


@dataclass(frozen=True, slots=True)
class Node:
    node_id: str
    gpu_ids: tuple[int, ...]
    cpus: float = 32.0
    memory_gb: float = 256.0
    gpu_type: str = "generic"
    link_bandwidth_gbps: Mapping[tuple[int, int], float] = field(default_factory=dict)
    """Bandwidth between two local GPU indices (symmetric; missing pairs share the PCIe/host path)."""


class ClusterState:
    """GPUs and which jobs hold them. Owned and mutated by the scheduler or simulator only."""

    __slots__ = ("_free_count", "gpu_jobs", "gpus", "nodes")

    def __init__(self, nodes: Iterable[Node], gpus: Iterable[Gpu]) -> None:
        self.nodes: dict[str, Node] = {n.node_id: n for n in nodes}
        self.gpus: list[Gpu] = sorted(gpus, key=lambda g: g.gpu_id)
        if [g.gpu_id for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError("GPU ids must be dense and start at 0")
        self.gpu_jobs: list[tuple[str, ...]] = [() for _ in self.gpus]
        """Job ids on each GPU (more than one only when a policy packs or time-slices)."""
        self._free_count = len(self.gpus)

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int, *, gpu_type: str = "generic",
                cpus: float = 32.0, memory_gb: float = 256.0) -> ClusterState:
        """A homogeneous cluster, e.g. ``uniform(32, 4)`` for the Tiresias 32x4 spec."""
        node_list: list[Node] = []
        gpu_list: list[Gpu] = []
        for n in range(nodes):
            node_id = f"node-{n}"
            ids = tuple(range(n * gpus_per_node, (n + 1) * gpus_per_node))
            node_list.append(Node(node_id, ids, cpus=cpus, memory_gb=memory_gb, gpu_type=gpu_type))
            gpu_list.extend(Gpu(g, node_id, i, gpu_type) for i, g in enumerate(ids))
        return cls(node_list, gpu_list)

    @property
    def total_gpus(self) -> int:
        return len(self.gpus)

    @property
    def free_gpu_count(self) -> int:
        return self._free_count

    def is_free(self, gpu_id: int) -> bool:
        return not self.gpu_jobs[gpu_id]

    def free_gpus(self) -> Iterator[int]:
        return (g for g, jobs in enumerate(self.gpu_jobs) if not jobs)

    def free_on_node(self, node_id: str) -> list[int]:
        return [g for g in self.nodes[node_id].gpu_ids if not self.gpu_jobs[g]]

    def node_of(self, gpu_id: int) -> str:
        return self.gpus[gpu_id].node_id

    # --- mutation: owner only -------------------------------------------------------------
    def assign(self, job_id: str, gpu_ids: Iterable[int]) -> None:
        for g in gpu_ids:
            held = self.gpu_jobs[g]
            if job_id in held:
                raise ValueError(f"job {job_id} already holds GPU {g}")
            if not held:
                self._free_count -= 1
            self.gpu_jobs[g] = (*held, job_id)

    def release(self, job_id: str, gpu_ids: Iterable[int]) -> None:
        for g in gpu_ids:
            held = self.gpu_jobs[g]
            if job_id not in held:
                raise ValueError(f"job {job_id} does not hold GPU {g}")
            rest = tuple(j for j in held if j != job_id)
            self.gpu_jobs[g] = rest
            if not rest:
                self._free_count += 1
