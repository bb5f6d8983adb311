"""GPU naming, in one place: (node id, local index) on the wire, dense global ids in ``ClusterState``.

Placement plans, leases and workers name a GPU by its node and NVML index; policies work on a
``ClusterState`` whose GPU ids are dense from 0. A ``Topology`` is built from the live nodes (in
node-id order) and converts both ways; it is rebuilt only when the live set changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from services.core.state import ClusterState, Gpu, Node
from services.scheduler.inventory import NodeInfo
from services.scheduler.leases import Lease


def node_of(info: NodeInfo, gpu_ids: tuple[int, ...]) -> Node:
    """The policies' ``Node`` for ``info`` with global ``gpu_ids``, its link facts included (a node
    that reported no uplink keeps ``Node``'s default)."""
    node = Node(
        info.node_id, gpu_ids, cpus=info.cpus, memory_gb=info.memory_gb, gpu_type=info.gpu_type,
        link_bandwidth_gbps=link_map(info.links),
    )  # fmt: skip
    return node if info.network_gbps is None else dataclasses.replace(node, network_gbps=info.network_gbps)


def link_map(links: Iterable[tuple[int, int, float]]) -> dict[tuple[int, int], float]:
    """``(a, b, Gb/s)`` pairs as ``Node.link_bandwidth_gbps`` (both orders)."""
    out: dict[tuple[int, int], float] = {}
    for a, b, gbps in links:
        out[(a, b)] = out[(b, a)] = gbps
    return out


class UnknownGpuError(LookupError):
    """A (node, local index) that is not a GPU of a live node."""


class Topology:
    """The live nodes' GPUs with their global ids."""

    __slots__ = ("_global", "_gpus", "_local", "_nodes", "infos", "version")

    def __init__(self, nodes: Iterable[NodeInfo], version: int = 0) -> None:
        self.version = version
        self.infos: list[NodeInfo] = []
        """The nodes, in the order their GPUs are numbered (what a round's snapshot sends)."""
        self._nodes: list[Node] = []
        self._gpus: list[Gpu] = []
        self._global: dict[str, dict[int, int]] = {}
        self._local: list[tuple[str, int]] = []
        for info in nodes:
            self.infos.append(info)
            start = len(self._gpus)
            ids = tuple(range(start, start + len(info.gpus)))
            self._nodes.append(node_of(info, ids))
            by_local: dict[int, int] = {}
            for gid, local in zip(ids, info.gpus, strict=True):
                self._gpus.append(Gpu(gid, info.node_id, local, info.gpu_type))
                self._local.append((info.node_id, local))
                by_local[local] = gid
            self._global[info.node_id] = by_local

    @property
    def total_gpus(self) -> int:
        return len(self._gpus)

    def has_node(self, node_id: str) -> bool:
        return node_id in self._global

    def cluster(self) -> ClusterState:
        """A fresh, empty ``ClusterState`` over these GPUs (the owner assigns the held ones)."""
        return ClusterState(self._nodes, self._gpus)

    def to_global(self, node_id: str, local: Sequence[int]) -> tuple[int, ...]:
        """Global ids of ``local`` GPUs on ``node_id``; raises ``UnknownGpuError``."""
        by_local = self._global.get(node_id)
        if by_local is None:
            raise UnknownGpuError(f"node {node_id!r} is not live")
        try:
            return tuple(by_local[i] for i in local)
        except KeyError as exc:
            raise UnknownGpuError(f"node {node_id!r} has no GPU {exc.args[0]}") from None

    def lease_gpus(self, lease: Lease) -> tuple[int, ...]:
        """Global ids of every GPU of ``lease``, cached on the lease per topology version."""
        if lease.global_version != self.version:
            lease.global_ids = tuple(g for node, local in lease.parts for g in self.to_global(node, local))
            lease.global_version = self.version
        return lease.global_ids

    def to_local(self, gpu_ids: Iterable[int]) -> list[tuple[str, tuple[int, ...]]]:
        """Group global ids by node, in first-seen node order: ``[(node_id, local indices), ...]``."""
        parts: dict[str, list[int]] = {}
        local = self._local
        for g in gpu_ids:
            node_id, index = local[g]
            parts.setdefault(node_id, []).append(index)
        return [(n, tuple(gpus)) for n, gpus in parts.items()]
