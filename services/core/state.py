"""Policy-facing views of jobs and of the cluster (after Blox §6.4, JobState and ClusterState).

The owner of the state (the scheduler service, or the simulator) mutates these objects between
rounds; policies receive them read-only by contract and must never mutate them (the simulator checks
this in debug mode). They are plain slotted classes rather than pydantic models because the simulator
holds hundreds of thousands of them and touches them on every event.

``ClusterState`` keeps a per-node index of free GPUs up to date on every ``assign``/``release``, so
placement policies can ask "which nodes have free GPUs" in time proportional to the answer instead
of scanning every GPU of a large cluster each round.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from schemas.job import JobClass, JobSpec
from schemas.rounds import UNAVAILABLE_GPUS

UNAVAILABLE = UNAVAILABLE_GPUS
"""Marker job that holds the free GPUs of a draining node in a ``ClusterState``, so no policy places
work there (the node's running jobs keep theirs)."""


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


class _Tiers:
    """Whether this process has made a ``JobState`` of a non-default priority (tier).

    ``services.core.round.by_priority`` skips its pass over every job while none was ever made:
    the result is the same (one tier), and a 2^19-job simulation of trace jobs, which have none,
    pays nothing per round for tiers it does not use (that pass cost it 20x its run time)."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen = False


TIERS = _Tiers()


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
    resumed_at: float | None = None
    """When the current run began making progress (after restoring its checkpoint), if the owner
    can tell; None otherwise. The simulator knows it exactly; time-slicing policies keep a job that
    is still restoring, so that a restore longer than their quantum cannot preempt a resumed job
    before it makes any progress."""
    last_preempt_time: float | None = None
    finish_time: float | None = None
    attained_service: float = 0.0
    """GPU-seconds of productive execution received so far: GPUs x executed time, the attained
    service of Tiresias (NSDI '19) that LAS ranks by."""
    executed_time: float = 0.0
    """Wall seconds of productive execution so far, whatever the GPU count."""
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
    grad_noise_scale: float | None = None
    """Latest gradient noise scale the job reported (examples; McCandlish et al.'s B_simple), which
    Pollux's statistical efficiency needs (``services.core.goodput``); None until it reports one."""
    batch_size: int | None = None
    """Latest total batch size the job reported; None until it reports one."""
    seq: int = 0
    """Submission sequence number from the owner (monotonic): the final tie-breaker of every order,
    so that rankings are total and deterministic even when submit times are equal."""
    queued_since: float | None = None
    """When the job last started waiting for GPUs (admission or suspension); None while running."""
    longest_wait_s: float = 0.0
    """Longest completed continuous wait so far; with ``queued_since`` a policy can tell how long a
    job has been starved (Blox's LAS promotes jobs that waited too long)."""
    run_start_service: float | None = None
    """``attained_service`` when the current run began, from the owner's own accounting (None unless
    running, or if the owner cannot tell): what the job has earned in this run is the difference
    (Tiresias: the queue the run began in)."""

    @property
    def job_class(self) -> JobClass:
        return self.spec.job_class

    @property
    def priority(self) -> int:
        """The job's tier (``spec.priority``): higher tiers rank first (``services.core.round.by_priority``)."""
        return self.spec.priority

    def __post_init__(self) -> None:
        if self.priority:
            TIERS.seen = True

    @property
    def gpus_requested(self) -> int:
        return self.spec.gpus

    @property
    def is_running(self) -> bool:
        return self.status is JobStatus.RUNNING

    @property
    def is_waiting(self) -> bool:
        return self.status is JobStatus.QUEUED

    def current_wait_s(self, now: float) -> float:
        """Seconds this job has been waiting continuously up to ``now`` (0 unless QUEUED)."""
        if self.queued_since is None or self.status is not JobStatus.QUEUED:
            return 0.0
        return max(0.0, now - self.queued_since)


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
    switch: str = "switch-0"
    """Network switch the node hangs off (Tiresias cluster specs group nodes by switch)."""
    network_gbps: float = 100.0
    """Bandwidth of the node's link to its switch."""


class ClusterState:
    """GPUs and which jobs hold them. Owned and mutated by the scheduler or simulator only."""

    __slots__ = (
        "_free_count",
        "_free_on_node",
        "_gpu_node",
        "_node_ids",
        "_node_index",
        "gpu_jobs",
        "gpus",
        "largest_node_gpus",
        "nodes",
        "shared_gpus",
    )

    def __init__(self, nodes: Iterable[Node], gpus: Iterable[Gpu]) -> None:
        self.nodes: dict[str, Node] = {n.node_id: n for n in nodes}
        self.gpus: list[Gpu] = sorted(gpus, key=lambda g: g.gpu_id)
        if [g.gpu_id for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError("GPU ids must be dense and start at 0")
        self.gpu_jobs: list[tuple[str, ...]] = [() for _ in self.gpus]
        """Job ids on each GPU (more than one only when a policy packs or time-slices)."""
        self._free_count = len(self.gpus)
        self._node_ids: list[str] = list(self.nodes)
        self._node_index: dict[str, int] = {n: i for i, n in enumerate(self._node_ids)}
        for g in self.gpus:
            if g.node_id not in self._node_index:
                raise ValueError(f"GPU {g.gpu_id} names unknown node {g.node_id!r}")
        self._gpu_node: list[int] = [self._node_index[g.node_id] for g in self.gpus]
        self.largest_node_gpus: int = max((len(n.gpu_ids) for n in self.nodes.values()), default=0)
        """GPUs on the largest node: a job needing at most this many can run on one node."""
        self._free_on_node: list[set[int]] = [set() for _ in self._node_ids]
        for g in self.gpus:
            self._free_on_node[self._gpu_node[g.gpu_id]].add(g.gpu_id)
        self.shared_gpus: set[int] = set()
        """GPUs that several jobs hold at once because a packing plan put them there (Gandiva packing,
        ``services.core.packing``), marked by the owner with ``mark_shared``; a GPU leaves the set when
        at most one job is left on it. Empty unless packing is on: anywhere else a second holder is a
        double booking (the simulator's invariant checks say so)."""

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

    @property
    def node_ids(self) -> list[str]:
        """Node ids in cluster order (the order placement policies break ties by)."""
        return self._node_ids

    def node_position(self, node_id: str) -> int:
        """Index of ``node_id`` in ``node_ids``."""
        return self._node_index[node_id]

    def node_position_of_gpu(self, gpu_id: int) -> int:
        """Index (in ``node_ids``) of the node that holds ``gpu_id``."""
        return self._gpu_node[gpu_id]

    @property
    def gpu_node_positions(self) -> list[int]:
        """``node_position_of_gpu`` as a list indexed by GPU id (read-only; for hot loops)."""
        return self._gpu_node

    def is_free(self, gpu_id: int) -> bool:
        return not self.gpu_jobs[gpu_id]

    def free_gpus(self) -> Iterator[int]:
        return (g for g, jobs in enumerate(self.gpu_jobs) if not jobs)

    def free_on_node(self, node_id: str) -> list[int]:
        return sorted(self._free_on_node[self._node_index[node_id]])

    def free_by_node(self) -> dict[int, set[int]]:
        """A fresh ``{node position: set of free GPU ids}`` for nodes with at least one free GPU, in
        cluster order.

        Costs time proportional to the free GPUs, not to the cluster size; the caller may mutate
        the result (placement policies use it as their scratch copy).
        """
        return {i: set(free) for i, free in enumerate(self._free_on_node) if free}

    def node_of(self, gpu_id: int) -> str:
        return self.gpus[gpu_id].node_id

    def nodes_spanned(self, gpu_ids: Iterable[int]) -> int:
        """How many distinct nodes hold ``gpu_ids``."""
        gpu_node = self._gpu_node
        return len({gpu_node[g] for g in gpu_ids})

    # --- mutation: owner only -------------------------------------------------------------
    def assign(self, job_id: str, gpu_ids: Iterable[int]) -> None:
        gpu_jobs = self.gpu_jobs
        for g in gpu_ids:
            held = gpu_jobs[g]
            if not held:
                self._free_count -= 1
                self._free_on_node[self._gpu_node[g]].discard(g)
                gpu_jobs[g] = (job_id,)
            elif job_id in held:
                raise ValueError(f"job {job_id} already holds GPU {g}")
            else:
                gpu_jobs[g] = (*held, job_id)

    def release(self, job_id: str, gpu_ids: Iterable[int]) -> None:
        gpu_jobs = self.gpu_jobs
        for g in gpu_ids:
            held = gpu_jobs[g]
            if len(held) == 1 and held[0] == job_id:  # the common case: the job held it alone
                gpu_jobs[g] = ()
                self._free_count += 1
                self._free_on_node[self._gpu_node[g]].add(g)
                continue
            if job_id not in held:
                raise ValueError(f"job {job_id} does not hold GPU {g}")
            rest = tuple(j for j in held if j != job_id)
            gpu_jobs[g] = rest
            if len(rest) < 2:
                self.shared_gpus.discard(g)
            if not rest:
                self._free_count += 1
                self._free_on_node[self._gpu_node[g]].add(g)

    def mark_shared(self, gpu_ids: Iterable[int]) -> None:
        """Record that the jobs holding ``gpu_ids`` share them by a packing plan's decision (owner
        only; after ``assign``)."""
        for g in gpu_ids:
            if len(self.gpu_jobs[g]) > 1:
                self.shared_gpus.add(g)
