"""Multi-resource demand on a node (CPU, RAM, GPU), shared by the FitGpp family of victim policies.

FitGpp (seed 000, §2.2 and footnote 1) describes a job's demand ``D_j`` as a vector of resource
quantities, each relative to the capacity of the node, and requires ``D_TE <= D_j + N`` where ``N``
is the free resource on the node where ``j`` runs. ``ClusterState`` tracks GPUs only, so CPU and
RAM in use on a node are derived here from the running jobs' specs.

Choice where the paper is silent (it assumes single-task, single-node jobs): a job that spans
several nodes uses its CPU and RAM on each node in proportion to the GPUs it holds there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.core.state import ClusterState, JobState

EPS = 1e-9
"""Tolerance on CPU/RAM comparisons (specs are floats)."""


@dataclass(slots=True)
class NodeRoom:
    """Free resources on one node (a scratch value; callers may mutate their own copies)."""

    gpus: int
    cpus: float
    memory_gb: float

    def fits(self, job: JobState) -> bool:
        spec = job.spec
        return spec.gpus <= self.gpus and spec.cpus <= self.cpus + EPS and spec.memory_gb <= self.memory_gb + EPS


def share_on_node(job: JobState, cluster: ClusterState) -> dict[int, tuple[int, float, float]]:
    """``{node position: (GPUs, CPUs, RAM GiB)}`` the running ``job`` holds on each node."""
    held = job.gpus
    if not held:
        return {}
    positions = cluster.gpu_node_positions
    spec = job.spec
    first = positions[held[0]]
    if len(held) == 1 or all(positions[g] == first for g in held):
        return {first: (len(held), spec.cpus, spec.memory_gb)}  # one node: the common case
    per_node: dict[int, int] = {}
    for g in held:
        node = positions[g]
        per_node[node] = per_node.get(node, 0) + 1
    total = len(held)
    return {n: (c, spec.cpus * c / total, spec.memory_gb * c / total) for n, c in per_node.items()}


def free_room(
    running: Iterable[JobState], cluster: ClusterState, spans: dict[tuple[int, ...], int] | None = None
) -> list[NodeRoom]:
    """Free GPUs, CPUs and RAM per node position, given the jobs that hold resources.

    Called on every round of the ``preempting`` placement, so it avoids per-job dicts: ``spans``
    (the caller's memo for one cluster) maps a GPU tuple to its node position, or -1 if the GPUs
    span nodes, and single-node jobs (FitGpp's are all single-task) are charged directly."""
    nodes = [cluster.nodes[n] for n in cluster.node_ids]
    cpus = [n.cpus for n in nodes]
    memory = [n.memory_gb for n in nodes]
    positions = cluster.gpu_node_positions
    memo: dict[tuple[int, ...], int] = {} if spans is None else spans
    for job in running:
        held = job.gpus
        if not held:
            continue
        node = memo.get(held)
        if node is None:
            first = positions[held[0]]
            node = memo[held] = first if all(positions[g] == first for g in held) else -1
        if node >= 0:
            spec = job.spec
            cpus[node] -= spec.cpus
            memory[node] -= spec.memory_gb
            continue
        for where, (_, c, m) in share_on_node(job, cluster).items():
            cpus[where] -= c
            memory[where] -= m
    free_gpus = [0] * len(nodes)
    for where, gpus in cluster.free_by_node().items():
        free_gpus[where] = len(gpus)
    return [NodeRoom(free_gpus[i], cpus[i], memory[i]) for i in range(len(nodes))]


def release(room: list[NodeRoom], job: JobState, cluster: ClusterState) -> None:
    """Add the resources ``job`` holds back to ``room`` (the caller's scratch copy)."""
    for node, (g, c, m) in share_on_node(job, cluster).items():
        slot = room[node]
        slot.gpus += g
        slot.cpus += c
        slot.memory_gb += m


def fits_somewhere(job: JobState, room: Sequence[NodeRoom], cluster: ClusterState) -> bool:
    """Whether ``job`` fits on one node of ``room``; a job wider than every node needs free GPUs
    in total (CPU/RAM unchecked, as ``consolidated`` spreads it over whole nodes)."""
    if job.spec.gpus > cluster.largest_node_gpus:
        return sum(r.gpus for r in room) >= job.spec.gpus
    return any(r.fits(job) for r in room)


def preemption_limit(job: JobState, default: int | None) -> int | None:
    """FitGpp's ``P`` for ``job``: its spec's ``max_preemptions`` if set, else the policy's default."""
    own = job.spec.max_preemptions
    return own if own is not None else default


def may_preempt(job: JobState, default: int | None) -> bool:
    """``PC_j < P`` (Eq. 2): the job has been preempted fewer times than its limit."""
    limit = preemption_limit(job, default)
    return limit is None or job.preemptions < limit


def until_fits(
    needed: JobState,
    candidates: Sequence[JobState],
    running: Sequence[JobState],
    cluster: ClusterState,
) -> tuple[str, ...]:
    """Preempt ``candidates`` in order until ``needed`` fits on some node; () if it never does.

    This is how FitGpp Appendix A describes its LRTP and RAND baselines: they "continue the
    preemption process until they can prepare enough resource for an incoming TE job". Every victim
    taken on the way is kept (the baselines do not give back victims that did not help).
    """
    room = free_room(running, cluster)
    if fits_somewhere(needed, room, cluster):
        return ()
    chosen: list[str] = []
    for victim in candidates:
        release(room, victim, cluster)
        chosen.append(victim.job_id)
        if fits_somewhere(needed, room, cluster):
            return tuple(chosen)
    return ()
