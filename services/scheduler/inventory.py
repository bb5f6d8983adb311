"""Nodes as the scheduler knows them: inventory from ``node.register``, liveness from heartbeats.

A node is *live* while its heartbeats arrive. One silent for ``lease_ttl_s`` is *dead*: its worker
has suspended its own jobs by then (it does so after the same TTL without the bus), so only then may
its GPUs go to other jobs. The clock is passed in (``now``, monotonic seconds), never read here.

The inventory is persisted (store ``meta`` key ``scheduler.nodes``) so that a restarted or newly
elected scheduler knows the nodes without replaying ``node.register``; a node loaded that way is
given a fresh ``lease_ttl_s`` from the load, because nobody knows when it last spoke.

A node *drains* (takes no new work, keeps its running jobs) when its agent says it is leaving
(``agent_draining``, from heartbeats) or an operator drained it (``drain``, an :class:`OperatorDrain`,
``roundhouse drain``). The operator's drain is persisted with the inventory and kept across the
agent's re-registrations, so it survives a scheduler restart or failover and an agent restart;
only ``roundhouse undrain`` lifts it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from schemas.nodes import NodeRegister
from services.core.heterogeneity import normalize_gpu_type

META_KEY = "scheduler.nodes"


@dataclass(frozen=True, slots=True)
class OperatorDrain:
    """An operator's drain of one node: who, when (epoch seconds) and why."""

    by: str
    at: float
    reason: str | None = None


@dataclass(slots=True)
class NodeInfo:
    """One worker node: its GPUs (local indices), host, incarnation and when it last spoke."""

    node_id: str
    hostname: str
    gpus: tuple[int, ...]
    incarnation: str
    cpus: float = 32.0
    memory_gb: float = 256.0
    gpu_type: str = "generic"
    last_seen: float = 0.0
    """Monotonic time of the last register or heartbeat."""
    agent_draining: bool = False
    """Its agent says it is leaving (a heartbeat's ``draining``)."""
    drain: OperatorDrain | None = None
    """An operator drained it (None: not drained by an operator)."""
    links: tuple[tuple[int, int, float], ...] = ()
    """Known bandwidths between its GPUs from the register, ``(local a, local b, Gb/s)`` with a < b."""
    network_gbps: float | None = None
    """Its uplink from the register (None: not reported)."""

    @property
    def draining(self) -> bool:
        """Takes no new work because it drains: its agent is leaving, or an operator drained it."""
        return self.agent_draining or self.drain is not None


class Inventory:
    """Registered nodes and their liveness; ``version`` changes whenever the live set could."""

    def __init__(self, lease_ttl_s: float, silent_s: float | None = None) -> None:
        self.lease_ttl_s = lease_ttl_s
        self.silent_s = silent_s if silent_s is not None else lease_ttl_s
        """A live node not heard from for this long takes no new work (its leases stand until
        ``lease_ttl_s``)."""
        self._nodes: dict[str, NodeInfo] = {}
        self._dead: set[str] = set()
        self.version = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> NodeInfo | None:
        return self._nodes.get(node_id)

    def register(self, event: NodeRegister, now: float) -> str | None:
        """Record a registration; returns the previous incarnation if the agent restarted."""
        previous = self._nodes.get(event.node_id)
        incarnation = str(event.incarnation)
        # An operator's drain outlives the agent: a restarted agent registering again is still drained.
        # The type policies see: the driver's product name normalised ("NVIDIA A100-SXM4-80GB" -> "a100"),
        # the vocabulary of cluster specs and of per-type throughputs (services.core.heterogeneity).
        gpu_type = normalize_gpu_type(event.gpus[0].name) if event.gpus else "generic"
        self._nodes[event.node_id] = NodeInfo(
            node_id=event.node_id,
            hostname=event.hostname,
            gpus=tuple(sorted(g.index for g in event.gpus)),
            incarnation=incarnation,
            cpus=event.cpus,
            memory_gb=event.memory_gb,
            gpu_type=gpu_type,
            last_seen=now,
            drain=previous.drain if previous is not None else None,
            links=pair_links(event),
            network_gbps=event.network_gbps,
        )
        self._dead.discard(event.node_id)
        self.version += 1
        if previous is not None and previous.incarnation != incarnation:
            return previous.incarnation
        return None

    def heartbeat(self, node_id: str, incarnation: uuid.UUID, draining: bool, now: float) -> bool:
        """Note a heartbeat; returns False if the node or its incarnation is unknown (not applied)."""
        node = self._nodes.get(node_id)
        if node is None or node.incarnation != str(incarnation):
            return False
        node.last_seen = now
        if node.agent_draining != draining:
            node.agent_draining = draining
            self.version += 1
        if node_id in self._dead:
            self._dead.discard(node_id)
            self.version += 1
        return True

    def set_drain(self, node_id: str, drain: OperatorDrain | None) -> bool:
        """Drain ``node_id`` as an operator (``drain``) or lift that drain (None); returns whether
        anything changed. KeyError for a node never registered."""
        node = self._nodes[node_id]
        if node.drain == drain:
            return False
        was = node.draining
        node.drain = drain
        if node.draining != was:
            self.version += 1
        return True

    def is_live(self, node_id: str) -> bool:
        return node_id in self._nodes and node_id not in self._dead

    def sweep(self, now: float) -> list[str]:
        """Mark nodes silent for ``lease_ttl_s`` dead; returns those newly dead."""
        newly = [
            n.node_id
            for n in self._nodes.values()
            if n.node_id not in self._dead and now - n.last_seen >= self.lease_ttl_s
        ]
        if newly:
            self._dead.update(newly)
            self.version += 1
        return newly

    def takes_work(self, node: NodeInfo, now: float) -> bool:
        """Whether new work may go to ``node`` at monotonic ``now``: live, not draining (a departing
        agent says it drains as it stops) and heard from within ``silent_s``."""
        return (
            node.node_id not in self._dead and not node.draining and now - node.last_seen < self.silent_s
        )

    def live(self) -> Iterator[NodeInfo]:
        """Live nodes in node-id order (the cluster order placement breaks ties by)."""
        for node_id in sorted(self._nodes):
            if node_id not in self._dead:
                yield self._nodes[node_id]

    def nodes(self) -> list[NodeInfo]:
        """Every registered node, live or not, in node-id order."""
        return [self._nodes[node_id] for node_id in sorted(self._nodes)]

    def touch_all(self, now: float) -> None:
        """Give every node a fresh TTL (a new leader does not know when they last spoke)."""
        for node in self._nodes.values():
            node.last_seen = now
        self._dead.clear()
        self.version += 1

    # --- persistence ------------------------------------------------------------------------
    def dumps(self) -> str:
        """Each node as ``[host, gpus, incarnation, cpus, memory_gb, gpu_type]``, an operator's
        drain as a seventh element ``{"by", "at", "reason"}`` (absent when not drained and nothing
        follows; null when link facts follow) and its link facts as an eighth,
        ``{"links": [[a, b, gbps], ...], "network_gbps"}`` (absent when it reported none)."""
        return json.dumps({n.node_id: _row(n) for n in self._nodes.values()}, separators=(",", ":"))

    def loads(self, text: str | None, now: float) -> None:
        self._nodes.clear()
        self._dead.clear()
        if text:
            for node_id, row in json.loads(text).items():
                host, gpus, inc, cpus, mem, gpu_type = row[:6]
                drain = _drain_from(row[6]) if len(row) > 6 else None
                links, network = _network_from(row[7]) if len(row) > 7 else ((), None)
                self._nodes[node_id] = NodeInfo(
                    node_id, host, tuple(gpus), inc, cpus, mem, gpu_type, last_seen=now, drain=drain,
                    links=links, network_gbps=network,
                )  # fmt: skip
        self.version += 1


def _row(node: NodeInfo) -> list[object]:
    row: list[object] = [node.hostname, list(node.gpus), node.incarnation, node.cpus, node.memory_gb, node.gpu_type]
    if node.drain is not None or node.links or node.network_gbps is not None:
        drain = node.drain
        row.append({"by": drain.by, "at": drain.at, "reason": drain.reason} if drain is not None else None)
    if node.links or node.network_gbps is not None:
        row.append({"links": [list(link) for link in node.links], "network_gbps": node.network_gbps})
    return row


def pair_links(event: NodeRegister) -> tuple[tuple[int, int, float], ...]:
    """The register's bandwidth matrix as ``(local a, local b, Gb/s)`` per known pair (a < b; 0 and the
    diagonal are "unknown" and left out). The schema bounds every value (finite, <= 100,000 Gb/s)
    and the matrix (one row and column per GPU, at most 64), so a hostile register costs little."""
    matrix = event.link_bandwidth_gbps
    if matrix is None:
        return ()
    index = [g.index for g in event.gpus]
    out: list[tuple[int, int, float]] = []
    for i, row in enumerate(matrix):
        for j in range(i + 1, len(row)):
            if row[j] > 0:
                a, b = sorted((index[i], index[j]))
                out.append((a, b, float(row[j])))
    return tuple(sorted(out))


def _network_from(value: object) -> tuple[tuple[tuple[int, int, float], ...], float | None]:
    """A stored row's link facts (a row written before they existed has none). An uplink of 0, which
    registers were accepted with before ``NodeRegister.network_gbps`` had to be > 0, is read as not
    reported: kept, it would make every round's snapshot invalid (``SnapshotNode.network_gbps`` > 0)."""
    if not isinstance(value, dict):
        return (), None
    links = tuple((int(a), int(b), float(g)) for a, b, g in value.get("links") or ())
    network = value.get("network_gbps")
    uplink = float(network) if network is not None else None
    return links, uplink if uplink is not None and uplink > 0 else None


def _drain_from(value: object) -> OperatorDrain | None:
    """A stored drain (a row written before drains existed has none)."""
    if not isinstance(value, dict):
        return None
    reason = value.get("reason")
    return OperatorDrain(str(value.get("by", "")), float(value.get("at", 0.0)), str(reason) if reason else None)
