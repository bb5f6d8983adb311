"""Placement's view of the cluster: nodes, the jobs it may be asked to place, and who holds what.

Built only from facts on the bus (docs/control-plane.md, Processes): inventory from
``node.register`` and liveness from ``node.heartbeat`` (``inventory.py``), job specs from
``job.arrived``, allocations from ``job.started`` (one per node part of a lease) and their end from
``job.suspended`` / ``job.completed`` / ``job.failed``. Every fact is applied idempotently, so the
view is the same whether a fact arrives once or again after a replay.

Allocations are kept per job as ``{lease id, node -> local GPU indices}``, independent of the
``ClusterState``: the dense global GPU ids a policy sees are rebuilt (lazily, at the next round)
whenever the inventory or an allocation changed. A lease's GPUs count as taken even when the job's
spec is unknown here, so placement never hands out GPUs a job is using.

A job's ``preemptions`` counts the suspensions of its leases seen here (the scheduler counts
every suspension too; a lease it releases as lost without a fact is not counted here).

Facts about an older lease than the one recorded are ignored, except a completion: the job then
ends when its recorded (newer) lease does, as the scheduler revokes that re-run. A registration
with a new incarnation drops the leases on that node (they died with the agent's processes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.base import Event
from schemas.jobs import JobArrived, JobCancel, JobCompleted, JobFailed, JobRejected, JobStarted, JobSuspended
from schemas.nodes import NodeHeartbeat, NodeRegister
from services.core.state import ClusterState, JobState, JobStatus
from services.placement.inventory import Inventory


@dataclass(slots=True)
class LeaseParts:
    """One lease of a job: which GPUs (local indices) it holds on each node."""

    lease_id: str
    parts: dict[str, tuple[int, ...]] = field(default_factory=dict)


class ClusterView:
    """Inventory, job specs and allocations, and the ``ClusterState`` they imply."""

    def __init__(self, *, lease_ttl_s: float) -> None:
        self.inventory = Inventory(lease_ttl_s=lease_ttl_s)
        self.jobs: dict[str, JobState] = {}
        """Unfinished jobs whose spec arrived, by id."""
        self.leases: dict[str, LeaseParts] = {}
        self._cancelled: set[str] = set()
        self._seq = 0
        self._cluster: ClusterState | None = None
        self._index: dict[tuple[str, int], int] = {}
        self._built_version = -1
        self._dirty = True

    # --- facts ------------------------------------------------------------------------------
    def apply(self, event: Event, now: float) -> None:
        """Apply one fact; ``now`` is the monotonic time it was received (for liveness)."""
        if isinstance(event, JobStarted):
            self._started(event)
        elif isinstance(event, JobSuspended):
            self._lease_ended(event.job_id, event.lease_id, finished=False)
        elif isinstance(event, JobCompleted):
            self._lease_ended(event.job_id, event.lease_id, finished=True, completed=True)
        elif isinstance(event, JobFailed):
            self._lease_ended(event.job_id, event.lease_id, finished=True)
        elif isinstance(event, JobArrived):
            self._arrived(event)
        elif isinstance(event, NodeHeartbeat):
            self.inventory.on_heartbeat(event, now)
        elif isinstance(event, NodeRegister):
            if self.inventory.on_register(event, now):
                self._node_restarted(event.node_id)
        elif isinstance(event, JobRejected):
            if event.job_id not in self.leases:
                self.jobs.pop(event.job_id, None)
        elif isinstance(event, JobCancel):
            if event.job_id in self.leases:
                self._cancelled.add(event.job_id)
            else:
                self.jobs.pop(event.job_id, None)

    def sweep(self, now: float) -> list[str]:
        """Mark silent nodes dead (see ``Inventory.sweep``); returns the nodes that just died."""
        return self.inventory.sweep(now)

    def _arrived(self, event: JobArrived) -> None:
        if event.job_id in self.jobs:
            return
        self._seq += 1
        self.jobs[event.job_id] = JobState(
            job_id=event.job_id, spec=event.spec, submit_time=event.ts, seq=self._seq, queued_since=event.ts
        )
        if event.job_id in self.leases:
            self._dirty = True  # it was running before its spec was seen: mark it running

    def _started(self, event: JobStarted) -> None:
        lease = self.leases.get(event.job_id)
        if lease is None or lease.lease_id != event.lease_id:
            lease = self.leases[event.job_id] = LeaseParts(event.lease_id)
        gpus = tuple(sorted(event.gpus))
        if lease.parts.get(event.node_id) != gpus:
            lease.parts[event.node_id] = gpus
            self._dirty = True

    def _lease_ended(self, job_id: str, lease_id: str | None, *, finished: bool, completed: bool = False) -> None:
        lease = self.leases.get(job_id)
        if lease is not None and lease_id is not None and lease.lease_id != lease_id:
            # The end of an earlier lease while a newer one runs. A completion means the job's work
            # is done: the scheduler completes it and revokes the re-run, so the job goes when the
            # newer lease ends (its GPUs stay taken until then). A failure of an earlier run
            # changes nothing (the scheduler ignores it too).
            if completed:
                self._cancelled.add(job_id)
            return
        if lease is not None:
            del self.leases[job_id]
            self._dirty = True
            job = self.jobs.get(job_id)
            if not finished and job is not None:
                # Counted as the scheduler counts it (every suspension of a lease), so a victim
                # policy's limit (FitGpp's PC_j < P) holds on the live cluster too.
                job.preemptions += 1
        if finished or job_id in self._cancelled:
            self._cancelled.discard(job_id)
            if job_id not in self.leases:
                self.jobs.pop(job_id, None)

    def _node_restarted(self, node_id: str) -> None:
        for job_id, lease in list(self.leases.items()):
            if lease.parts.pop(node_id, None) is not None and not lease.parts:
                del self.leases[job_id]
        self._dirty = True

    # --- reads --------------------------------------------------------------------------------
    def cluster(self) -> ClusterState:
        """The ``ClusterState`` of live nodes with every known allocation assigned; jobs' ``status``
        and ``gpus`` (global ids) are brought up to date with it. Rebuilt only after a change."""
        if self._cluster is not None and not self._dirty and self._built_version == self.inventory.version:
            return self._cluster
        cluster, index = self.inventory.build_cluster()
        running: set[str] = set()
        for job_id, lease in self.leases.items():
            gpus = tuple(
                index[(node_id, local)]
                for node_id, locals_ in lease.parts.items()
                for local in locals_
                if (node_id, local) in index
            )
            if not gpus:
                continue  # every part is on a dead (or unknown) node
            cluster.assign(job_id, gpus)
            job = self.jobs.get(job_id)
            if job is not None:
                job.status = JobStatus.RUNNING
                job.gpus = gpus
                job.queued_since = None
                running.add(job_id)
        for job_id, job in self.jobs.items():
            if job_id not in running and job.status is JobStatus.RUNNING:
                job.status = JobStatus.QUEUED
                job.gpus = ()
        self._cluster, self._index = cluster, index
        self._built_version = self.inventory.version
        self._dirty = False
        return cluster

    def node_gpus(self, gpu_ids: tuple[int, ...]) -> dict[str, list[int]]:
        """Global GPU ids of the last built cluster as ``{node id: [local indices]}``, in node order."""
        cluster = self._cluster
        if cluster is None:
            raise RuntimeError("node_gpus() needs a cluster: call cluster() first")
        by_node: dict[str, list[int]] = {}
        for g in sorted(gpu_ids):
            gpu = cluster.gpus[g]
            by_node.setdefault(gpu.node_id, []).append(gpu.local_index)
        return by_node
