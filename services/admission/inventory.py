"""The cluster's nodes as the workers report them: inventory from ``node.register``, liveness from
``node.heartbeat``, turned into the ``ClusterState`` the policies read.

Rounds name GPUs per node (node id + local NVML index, see ``schemas.rounds``); the dense global
GPU ids of a ``ClusterState`` are private to the process that built it. Nodes are numbered in
sorted ``node_id`` order, so two replicas that saw the same registrations build the same state.

Liveness (docs/control-plane.md, A round): a node is live while its heartbeats arrive; one silent
for ``lease_ttl_s`` is dead and its GPUs are left out of the cluster. Silence is measured on this
process's monotonic clock from when it last heard of the node (registration or heartbeat), never
from the event's ``ts``: admission starts from the live nodes the scheduler knows
(``query.admission``), each counted as heard at that moment, so it has a full TTL to send its next
heartbeat; registrations are followed from there. A draining node keeps its running jobs but
offers no free GPU (its free GPUs are held by the marker job :data:`UNAVAILABLE`).

A node drains when its agent says it is leaving (``agent_draining``, each heartbeat's ``draining``)
or an operator drained it (``operator_drained``), as in the scheduler's inventory; ``draining`` is
their OR. A heartbeat says nothing of operator drains, so it sets only the agent's part; the
operator's part comes from the scheduler (``query.admission`` at the start, then ``query.nodes``
every ``drain_refresh_s``: ``services.admission.drains``) and outlives a re-registration, as the
scheduler keeps it.

Admission's view of the nodes (it needs the cluster's GPU total). Placement keeps none: each round
carries its nodes (``schemas.rounds``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from schemas.nodes import NodeHeartbeat, NodeRegister
from services.core.state import UNAVAILABLE, ClusterState, Gpu, Node

_UNKNOWN_SWITCH = "switch-0"


@dataclass(slots=True)
class NodeRecord:
    """What is known about one node."""

    register: NodeRegister
    last_heard: float
    """Monotonic time of the last registration or heartbeat of this incarnation."""
    agent_draining: bool = False
    """Its agent says it is leaving (the last heartbeat's ``draining``)."""
    operator_drained: bool = False
    """An operator drained it (the scheduler's ``drained_by``; module doc)."""

    @property
    def draining(self) -> bool:
        """Takes no new work because it drains: its agent is leaving, or an operator drained it."""
        return self.agent_draining or self.operator_drained

    @property
    def incarnation(self) -> uuid.UUID:
        return self.register.incarnation


def node_from_register(reg: NodeRegister, gpu_ids: tuple[int, ...]) -> tuple[Node, list[Gpu]]:
    """The core ``Node`` and its ``Gpu``s for a registration, with global ids ``gpu_ids`` (in the
    order of ``reg.gpus``). Link bandwidths are keyed by local index; ``labels['switch']`` (or
    ``rack``) names the node's network switch."""
    gpus = [
        Gpu(gpu_id, reg.node_id, inv.index, inv.name, inv.memory_mib)
        for gpu_id, inv in zip(gpu_ids, reg.gpus, strict=True)
    ]
    bandwidth: dict[tuple[int, int], float] = {}
    if reg.link_bandwidth_gbps is not None:
        for i, row in enumerate(reg.link_bandwidth_gbps):
            for j, value in enumerate(row):
                if i != j and value > 0:  # 0: unknown
                    bandwidth[(reg.gpus[i].index, reg.gpus[j].index)] = value
    gpu_type = reg.gpus[0].name if reg.gpus else "generic"
    switch = reg.labels.get("switch") or reg.labels.get("rack") or _UNKNOWN_SWITCH
    node = Node(
        reg.node_id,
        gpu_ids,
        cpus=reg.cpus,
        memory_gb=reg.memory_gb,
        gpu_type=gpu_type,
        link_bandwidth_gbps=bandwidth,
        switch=switch,
    )
    if reg.network_gbps is not None:
        node = dataclasses.replace(node, network_gbps=reg.network_gbps)
    return node, gpus


class Inventory:
    """Registered nodes and their liveness; builds a fresh ``ClusterState`` of the live nodes.

    ``version`` increases whenever the set of usable nodes or their GPUs changes, so owners can
    cache the cluster they built and rebuild only when it moved.
    """

    def __init__(self, *, lease_ttl_s: float) -> None:
        if lease_ttl_s <= 0:
            raise ValueError(f"lease_ttl_s must be > 0, got {lease_ttl_s}")
        self.lease_ttl_s = lease_ttl_s
        self.nodes: dict[str, NodeRecord] = {}
        self._live: set[str] = set()
        self.version = 0

    # --- facts ------------------------------------------------------------------------------
    def on_register(self, reg: NodeRegister, now: float, *, draining: bool | None = None) -> bool:
        """Record a registration; returns True when it is a new node or a new incarnation (the
        node's previous processes, and so its leases, are gone). ``draining``: what the scheduler
        knew of a node admission starts from, taken as an operator's drain until the next refresh
        says otherwise (``query.admission`` does not tell the two apart); None (a registration,
        which says nothing about it) keeps the operator's drain the node had."""
        old = self.nodes.get(reg.node_id)
        if draining is None:
            draining = old is not None and old.operator_drained
        self.nodes[reg.node_id] = NodeRecord(reg, now, operator_drained=draining)
        self._live.add(reg.node_id)
        self.version += 1
        return old is None or old.incarnation != reg.incarnation

    def on_heartbeat(self, hb: NodeHeartbeat, now: float) -> bool:
        """Refresh a node's liveness; returns True if that changed what the cluster offers.

        A heartbeat of another incarnation than the registered one is ignored: the agent restarted
        and will re-register (with its new inventory)."""
        record = self.nodes.get(hb.node_id)
        if record is None or record.incarnation != hb.incarnation:
            return False
        record.last_heard = now
        changed = False
        if hb.node_id not in self._live:
            self._live.add(hb.node_id)
            changed = True
        if record.agent_draining != hb.draining:
            was = record.draining
            record.agent_draining = hb.draining
            changed = changed or record.draining != was
        if changed:
            self.version += 1
        return changed

    def set_operator_drains(self, drained: Mapping[str, bool]) -> list[str]:
        """Apply the scheduler's operator drains (node id -> drained; nodes it did not name keep
        theirs); returns the nodes whose ``draining`` changed, sorted."""
        changed: list[str] = []
        for node_id, flag in drained.items():
            record = self.nodes.get(node_id)
            if record is None or record.operator_drained == flag:
                continue
            was = record.draining
            record.operator_drained = flag
            if record.draining != was:
                changed.append(node_id)
        if changed:
            self.version += 1
        return sorted(changed)

    def sweep(self, now: float) -> list[str]:
        """Mark nodes silent for longer than ``lease_ttl_s`` dead; returns the ones that just died."""
        died = [n for n in self._live if now - self.nodes[n].last_heard > self.lease_ttl_s]
        for node_id in died:
            self._live.discard(node_id)
        if died:
            self.version += 1
        return sorted(died)

    # --- reads --------------------------------------------------------------------------------
    def live_nodes(self) -> list[NodeRecord]:
        """Live nodes in cluster order (sorted by id)."""
        return [self.nodes[n] for n in sorted(self._live)]

    def is_live(self, node_id: str) -> bool:
        return node_id in self._live

    @property
    def total_gpus(self) -> int:
        return sum(len(self.nodes[n].register.gpus) for n in self._live)

    def build_cluster(self) -> tuple[ClusterState, dict[tuple[str, int], int]]:
        """A ``ClusterState`` of the live nodes, and the map (node id, local index) -> global GPU id.

        Every GPU of a draining node is held by :data:`UNAVAILABLE`; the caller then assigns the
        jobs' allocations on top (a GPU may be held by the marker and a job at once, which
        ``ClusterState`` allows), so a GPU a job frees on a draining node never becomes free."""
        nodes: list[Node] = []
        gpus: list[Gpu] = []
        index: dict[tuple[str, int], int] = {}
        next_id = 0
        for record in self.live_nodes():
            reg = record.register
            ids = tuple(range(next_id, next_id + len(reg.gpus)))
            next_id += len(reg.gpus)
            node, node_gpus = node_from_register(reg, ids)
            nodes.append(node)
            gpus.extend(node_gpus)
            for gpu in node_gpus:
                index[(gpu.node_id, gpu.local_index)] = gpu.gpu_id
        cluster = ClusterState(nodes, gpus)
        for record in self.live_nodes():
            if record.draining:
                held = [index[(record.register.node_id, g.index)] for g in record.register.gpus]
                cluster.assign(UNAVAILABLE, held)
        return cluster, index
