"""A round's snapshot on the wire: the scheduler writes it, a placement instance holds it.

The scheduler ranks on its ``JobState``s and ``ClusterState``; the placement service must place on
exactly that state (``schemas.rounds``, "The round carries its snapshot"). :class:`SnapshotWriter`
turns the scheduler's state into a :class:`~schemas.rounds.RoundSnapshot`, full or as a delta against
what the addressed placement instance acknowledged; :class:`SnapshotReplica` applies those snapshots
on the placement side and rebuilds the same ``JobState``s and ``ClusterState``. Both sides advance a
running job's progress to the round's ``now`` with :func:`advance_run`, so a running job is re-sent
only when something other than the clock changed.

Pure: no I/O, no clock. The cost that matters is the scheduler's per-round comparison of every
active job against what the peer holds (a tuple per job); jobs that did not change are not encoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from schemas.job import JobSpec
from schemas.rounds import GpuPairLink, NodeGpus, PolicySpec, RoundSnapshot, SnapshotJob, SnapshotNode
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node

__all__ = [
    "BaseMismatchError",
    "NodeInfoLike",
    "SnapshotReplica",
    "SnapshotWriter",
    "UnknownSnapshotGpuError",
    "advance_run",
    "job_spec",
    "policy_spec",
]

_REDACTED = ["-"]


def advance_run(
    service0: float, executed0: float, gpu_count: int, start: float | None, now: float
) -> tuple[float, float]:
    """A running job's attained service and executed seconds at ``now``: what its run began with
    plus GPUs x the time since ``start`` (its launch). The scheduler's book and a placement replica
    both call this, so they compute the same floats."""
    dt = max(0.0, now - (start if start is not None else now))
    return service0 + gpu_count * dt, executed0 + dt


_POLICY_FIELDS = tuple(PolicySpec.model_fields)


def policy_spec(spec: JobSpec) -> PolicySpec:
    """``spec`` as a round carries it: what policies read, without the argv, the environment (it
    may hold secrets) and the working directory."""
    return PolicySpec.model_construct(**{name: getattr(spec, name) for name in _POLICY_FIELDS})


def job_spec(spec: PolicySpec) -> JobSpec:
    """The ``JobSpec`` a placement replica gives policies: ``spec`` with a placeholder argv."""
    return JobSpec.model_construct(command=_REDACTED, env={}, workdir=None, **{
        name: getattr(spec, name) for name in _POLICY_FIELDS
    })  # fmt: skip


class BaseMismatchError(LookupError):
    """A delta whose base this replica does not hold: the sender must send the round in full."""


class UnknownSnapshotGpuError(ValueError):
    """A job in a snapshot holds a GPU that is not one of the snapshot's nodes."""


class NodeInfoLike(Protocol):
    """What :meth:`SnapshotWriter.encode` reads of a node (the scheduler's ``NodeInfo`` has it); ``links``
    are its known GPU-pair bandwidths ``(local a, local b, Gb/s)``."""

    @property
    def node_id(self) -> str: ...
    @property
    def gpus(self) -> tuple[int, ...]: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def cpus(self) -> float: ...
    @property
    def memory_gb(self) -> float: ...
    @property
    def links(self) -> tuple[tuple[int, int, float], ...]: ...
    @property
    def network_gbps(self) -> float | None: ...


_Key = tuple[object, ...]
_UNACKED_KEPT = 4


def _key(job: JobState, service0: float, executed0: float) -> _Key:
    history = job.loss_history
    return (
        job.status, job.gpus, job.admit_time, job.first_start_time, job.last_start_time, job.resumed_at,
        job.last_preempt_time, job.queued_since, job.longest_wait_s, service0, executed0, job.iterations_done,
        job.preemptions, job.loss, len(history), history[-1] if history else None, job.iteration_time_s,
        job.grad_noise_scale, job.batch_size,
    )  # fmt: skip


@dataclass(slots=True)
class _Sent:
    """What one snapshot version told the peer: each job's key, and the nodes."""

    keys: dict[str, _Key]
    nodes: tuple[object, ...]


class SnapshotWriter:
    """The scheduler's side: encodes each round's state for the placement instance it talks to.

    ``encode`` returns a delta when a peer has acknowledged a version (``acknowledged``) and a full
    snapshot otherwise; ``forget`` drops the peer (it timed out, or asked for a resync)."""

    def __init__(self) -> None:
        self.peer: str | None = None
        self._next_version = 0
        self._acked: tuple[int, _Sent] | None = None
        self._sent: dict[int, _Sent] = {}
        self._specs: dict[str, PolicySpec] = {}

    def forget(self) -> None:
        self.peer = None
        self._acked = None
        self._sent.clear()

    def acknowledged(self, instance: str, version: int) -> None:
        """``instance`` answered the round that carried snapshot ``version``: it holds that version now
        (versions are this writer's own, one per ``encode``)."""
        sent = self._sent.pop(version, None)
        self._sent = {v: s for v, s in self._sent.items() if v > version}
        if sent is None:
            if self.peer != instance:
                self.forget()
            return
        self.peer = instance
        self._acked = (version, sent)

    def encode(
        self,
        *,
        now: float,
        jobs: Mapping[str, JobState],
        run_start: Callable[[str], tuple[float, float]],
        nodes: Sequence[NodeInfoLike],
        to_local: Callable[[Iterable[int]], list[tuple[str, tuple[int, ...]]]],
        held: Mapping[str, tuple[int, ...]] | None = None,
        full: bool = False,
    ) -> RoundSnapshot:
        """The snapshot of ``jobs`` (the active set the ranking used) and ``nodes`` at ``now``.

        ``run_start(job_id)`` gives a running job's ``(service0, executed0)``; ``to_local`` names
        global GPU ids per node; ``held`` the GPUs of leases whose jobs are not running in ``jobs``.
        With a peer and not ``full``, only what changed since its base."""
        node_rows = tuple(
            (n.node_id, tuple(n.gpus), n.gpu_type, n.cpus, n.memory_gb, tuple(n.links), n.network_gbps) for n in nodes
        )
        base = None if full or self.peer is None else self._acked
        old_keys: Mapping[str, _Key] = base[1].keys if base is not None else {}
        keys: dict[str, _Key] = {}
        rows: list[SnapshotJob] = []
        specs = self._specs
        for job_id, job in jobs.items():
            running = job.status is JobStatus.RUNNING
            if running:
                service0, executed0 = run_start(job_id)
            else:
                service0, executed0 = job.attained_service, job.executed_time
            key = _key(job, service0, executed0)
            keys[job_id] = key
            old = old_keys.get(job_id)
            if old == key:
                continue
            spec = None
            if old is None:
                spec = specs.get(job_id)
                if spec is None:
                    spec = specs[job_id] = policy_spec(job.spec)
            rows.append(SnapshotJob.model_construct(
                job_id=job_id, spec=spec, submit_time=job.submit_time, seq=job.seq, running=running,
                gpus=[NodeGpus.model_construct(node_id=n, gpus=list(g)) for n, g in to_local(job.gpus)]
                if running else [],
                admit_time=job.admit_time, first_start_time=job.first_start_time,
                last_start_time=job.last_start_time, resumed_at=job.resumed_at,
                last_preempt_time=job.last_preempt_time, queued_since=job.queued_since,
                longest_wait_s=job.longest_wait_s, service0=service0, executed0=executed0,
                iterations_done=job.iterations_done, preemptions=job.preemptions, loss=job.loss,
                loss_history=list(job.loss_history), iteration_time_s=job.iteration_time_s,
                grad_noise_scale=job.grad_noise_scale, batch_size=job.batch_size,
            ))  # fmt: skip
        removed = [job_id for job_id in old_keys if job_id not in keys]
        for job_id in [j for j in specs if j not in jobs]:
            del specs[job_id]
        send_nodes = base is None or base[1].nodes != node_rows
        self._next_version += 1
        version = self._next_version
        self._sent[version] = _Sent(keys, node_rows)
        if len(self._sent) > _UNACKED_KEPT:  # rounds that were never answered: their plans never will be
            del self._sent[min(self._sent)]
        return RoundSnapshot.model_construct(
            version=version,
            base=base[0] if base is not None else None,
            now=now,
            nodes=[
                SnapshotNode.model_construct(
                    node_id=n,
                    gpus=list(g),
                    gpu_type=t,
                    cpus=c,
                    memory_gb=m,
                    network_gbps=up,
                    links=[GpuPairLink.model_construct(a=a, b=b, gbps=bw) for a, b, bw in links],
                )
                for n, g, t, c, m, links, up in node_rows
            ]
            if send_nodes
            else None,
            jobs=rows,
            removed=removed,
            held={
                job_id: [NodeGpus.model_construct(node_id=n, gpus=list(g)) for n, g in to_local(gpus)]
                for job_id, gpus in (held or {}).items()
                if gpus
            },
        )


class SnapshotReplica:
    """The placement side: the snapshot this instance holds, as ``JobState``s and a ``ClusterState``.

    ``apply`` takes a full snapshot or a delta against the held version (else
    :class:`BaseMismatchError`) and returns the jobs and cluster at the snapshot's ``now``, with
    running jobs' progress advanced by :func:`advance_run` and their GPUs assigned. A delta costs
    time in what it carries plus the running jobs, not in the queue: unchanged jobs keep their
    ``JobState`` (policies never mutate their inputs) and the cluster is updated in place. Nothing
    changes unless the whole snapshot applies."""

    def __init__(self) -> None:
        self.version: int | None = None
        self._jobs: dict[str, JobState] = {}
        self._run_starts: dict[str, tuple[float, float]] = {}
        """Running jobs' (service0, executed0)."""
        self._held: dict[str, tuple[int, ...]] = {}
        self._nodes: list[SnapshotNode] = []
        self._index: dict[tuple[str, int], int] = {}
        self._cluster: ClusterState | None = None

    @property
    def cluster(self) -> ClusterState | None:
        """The cluster of the snapshot held (None before the first): what the last round placed on."""
        return self._cluster

    def apply(self, snapshot: RoundSnapshot) -> tuple[dict[str, JobState], ClusterState]:
        full = snapshot.base is None
        if not full and snapshot.base != self.version:
            raise BaseMismatchError(f"delta against version {snapshot.base}; this instance holds {self.version}")
        if full and snapshot.nodes is None:
            raise BaseMismatchError("a full snapshot without its nodes")
        rebuild = full or snapshot.nodes is not None
        if rebuild:
            nodes = list(snapshot.nodes if snapshot.nodes is not None else self._nodes)
            cluster, index = _cluster_of(nodes)
        else:
            nodes, index = self._nodes, self._index
        # Check everything before changing anything.
        old = {} if full else self._jobs
        specs: dict[str, JobSpec] = {}
        new_gpus: dict[str, tuple[int, ...]] = {}
        for row in snapshot.jobs:
            if row.spec is not None:
                specs[row.job_id] = job_spec(row.spec)
            elif row.job_id not in old:
                raise BaseMismatchError(f"job {row.job_id!r} is sent without its spec and is not in the base")
            if row.running:
                new_gpus[row.job_id] = _global_ids(index, row.job_id, row.gpus)
        held = {job_id: _global_ids(index, job_id, parts) for job_id, parts in snapshot.held.items()}
        if rebuild and not full:  # new nodes: every kept job's GPUs are renumbered
            for job_id, state in self._jobs.items():
                if state.is_running and job_id not in new_gpus and job_id not in snapshot.removed:
                    old_parts = _by_node(self._cluster, state.gpus) if self._cluster is not None else {}
                    new_gpus[job_id] = _global_ids(index, job_id, [
                        NodeGpus.model_construct(node_id=n, gpus=g) for n, g in old_parts.items()
                    ])  # fmt: skip
        # Apply.
        if rebuild:
            jobs: dict[str, JobState] = {} if full else self._jobs
            if not full:
                for state in jobs.values():
                    if state.is_running and state.job_id in new_gpus:
                        state.gpus = new_gpus[state.job_id]
            self._held = {}
        else:
            jobs = self._jobs
            cluster = self._cluster  # type: ignore[assignment]  # set by the full snapshot before any delta
            for job_id, gpus in self._held.items():
                if held.get(job_id) != gpus:
                    cluster.release(job_id, gpus)
        run_starts = {} if full else self._run_starts
        for job_id in snapshot.removed:
            run_starts.pop(job_id, None)
            if job_id in jobs:
                gone = jobs.pop(job_id)
                if gone.is_running and not rebuild:
                    cluster.release(job_id, gone.gpus)
        for row in snapshot.jobs:
            job_id = row.job_id
            previous = jobs.get(job_id)
            if previous is not None and previous.is_running and not rebuild:
                cluster.release(job_id, previous.gpus)
            state = JobState(
                job_id=job_id, spec=specs[job_id] if row.spec is not None else old[job_id].spec,
                submit_time=row.submit_time, seq=row.seq, admit_time=row.admit_time,
                first_start_time=row.first_start_time, last_start_time=row.last_start_time,
                resumed_at=row.resumed_at, last_preempt_time=row.last_preempt_time, queued_since=row.queued_since,
                longest_wait_s=row.longest_wait_s, iterations_done=row.iterations_done,
                preemptions=row.preemptions, loss=row.loss, loss_history=list(row.loss_history),
                iteration_time_s=row.iteration_time_s, attained_service=row.service0, executed_time=row.executed0,
                grad_noise_scale=row.grad_noise_scale, batch_size=row.batch_size,
            )  # fmt: skip
            if row.running:
                state.status = JobStatus.RUNNING
                state.gpus = new_gpus[job_id]
                state.run_start_service = row.service0
                run_starts[job_id] = (row.service0, row.executed0)
                if not rebuild:
                    cluster.assign(job_id, state.gpus)
            else:
                run_starts.pop(job_id, None)
            jobs[job_id] = state
        if rebuild:
            for job_id, state in jobs.items():
                if state.is_running and state.gpus:
                    cluster.assign(job_id, state.gpus)
        for job_id, gpus in held.items():
            if rebuild or self._held.get(job_id) != gpus:
                cluster.assign(job_id, gpus)
        now = snapshot.now
        for job_id, (service0, executed0) in run_starts.items():
            state = jobs[job_id]
            state.attained_service, state.executed_time = advance_run(
                service0, executed0, len(state.gpus), state.last_start_time, now
            )
        self._jobs, self._run_starts, self._held, self._cluster = jobs, run_starts, held, cluster
        self._nodes, self._index, self.version = nodes, index, snapshot.version
        return dict(jobs), cluster


def _cluster_of(nodes: Sequence[SnapshotNode]) -> tuple[ClusterState, dict[tuple[str, int], int]]:
    """The empty cluster of ``nodes`` (GPUs numbered in node order), and (node, local) -> global id."""
    node_list: list[Node] = []
    gpu_list: list[Gpu] = []
    index: dict[tuple[str, int], int] = {}
    for info in nodes:
        start = len(gpu_list)
        ids = tuple(range(start, start + len(info.gpus)))
        node = Node(info.node_id, ids, cpus=info.cpus, memory_gb=info.memory_gb, gpu_type=info.gpu_type,
                    link_bandwidth_gbps=_link_map(info.links))  # fmt: skip
        node_list.append(node if info.network_gbps is None else replace(node, network_gbps=info.network_gbps))
        for gid, local in zip(ids, info.gpus, strict=True):
            gpu_list.append(Gpu(gid, info.node_id, local, info.gpu_type))
            index[(info.node_id, local)] = gid
    return ClusterState(node_list, gpu_list), index


def _link_map(links: Iterable[GpuPairLink]) -> dict[tuple[int, int], float]:
    """A snapshot node's links as ``Node.link_bandwidth_gbps`` (both orders)."""
    out: dict[tuple[int, int], float] = {}
    for link in links:
        out[(link.a, link.b)] = out[(link.b, link.a)] = link.gbps
    return out


def _global_ids(index: Mapping[tuple[str, int], int], job_id: str, parts: Iterable[NodeGpus]) -> tuple[int, ...]:
    try:
        return tuple(index[(part.node_id, g)] for part in parts for g in part.gpus)
    except KeyError as exc:
        raise UnknownSnapshotGpuError(f"job {job_id!r} holds GPU {exc.args[0]}, not on a snapshot node") from None


def _by_node(cluster: ClusterState, gpu_ids: Iterable[int]) -> dict[str, list[int]]:
    by_node: dict[str, list[int]] = {}
    for g in gpu_ids:
        gpu = cluster.gpus[g]
        by_node.setdefault(gpu.node_id, []).append(gpu.local_index)
    return by_node
