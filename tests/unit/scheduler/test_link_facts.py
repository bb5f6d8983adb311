"""Link bandwidths from ``node.register`` to the placement replica's ``ClusterState``.

The register's matrix becomes the scheduler inventory's pairs, survives the inventory's persistence,
becomes ``Node.link_bandwidth_gbps`` in the scheduler's topology, travels in the round snapshot and is
rebuilt by the placement replica; a node that reports nothing keeps today's defaults everywhere.
"""

from __future__ import annotations

import json
import uuid

import pytest
from pydantic import ValidationError

from schemas.codec import decode, encode
from schemas.nodes import GpuInventory, NodeRegister
from schemas.rounds import RoundSnapshot, ScheduleRound, SnapshotNode
from schemas.subjects import schedule_round
from services.core.snapshot import SnapshotReplica
from services.core.state import Node
from services.scheduler.inventory import Inventory, pair_links
from services.scheduler.topology import Topology
from tests.round_builders import NodeInfo, Owner

NVLINK = 400.0


def register(node_id: str, matrix: list[list[float]] | None, network: float | None = None,
             indices: tuple[int, ...] = (0, 1, 2, 3)) -> NodeRegister:  # fmt: skip
    gpus = [GpuInventory(index=i, uuid=f"GPU-{node_id}-{i}", name="V100", memory_mib=16_384) for i in indices]
    return NodeRegister(node_id=node_id, incarnation=uuid.uuid4(), hostname="h", cpus=8, memory_gb=64,
                        gpus=gpus, link_bandwidth_gbps=matrix, network_gbps=network)  # fmt: skip


def wire(snapshot: RoundSnapshot) -> tuple[RoundSnapshot, bytes]:
    """Through the real codec in a round, as the bus sends it; and the bytes sent."""
    message = ScheduleRound.model_construct(epoch=1, round=1, state_version=1, ranked=[], gpu_targets={},
                                            terminate={}, snapshot=snapshot)  # fmt: skip
    data = encode(message)
    decoded = decode(schedule_round(), data)
    assert isinstance(decoded, ScheduleRound)
    assert decoded.snapshot is not None
    return decoded.snapshot, data


def quad(fast: tuple[int, int]) -> list[list[float]]:
    """4 GPUs, every pair 200 Gb/s except ``fast`` (400); 0 on the diagonal."""
    m = [[0.0 if i == j else 200.0 for j in range(4)] for i in range(4)]
    a, b = fast
    m[a][b] = m[b][a] = NVLINK
    return m


def test_the_register_matrix_becomes_pairs_once_each_without_unknowns() -> None:
    m = quad((0, 3))
    m[1][2] = m[2][1] = 0.0  # unknown
    links = pair_links(register("n", m))
    assert (0, 3, NVLINK) in links
    assert (0, 1, 200.0) in links
    assert all(a < b for a, b, _ in links)
    assert not any((a, b) == (1, 2) for a, b, _ in links)
    assert len(links) == 5
    assert pair_links(register("n", None)) == ()


def test_pairs_are_keyed_by_nvml_index_not_by_row() -> None:
    m = [[0.0, 300.0], [300.0, 0.0]]
    assert pair_links(register("n", m, indices=(2, 5))) == ((2, 5, 300.0),)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 1e9])
def test_a_hostile_bandwidth_is_refused_by_the_schema(bad: float) -> None:
    m = quad((0, 3))
    m[0][1] = m[1][0] = bad
    with pytest.raises(ValidationError):
        register("n", m)
    with pytest.raises(ValidationError):
        register("n", quad((0, 3)), network=bad)


def test_an_oversized_matrix_is_refused() -> None:
    with pytest.raises(ValidationError):
        register("n", [[0.0] * 65 for _ in range(65)])


def test_the_inventory_keeps_link_facts_across_persistence_and_reads_old_rows() -> None:
    inventory = Inventory(lease_ttl_s=10.0)
    inventory.register(register("fast", quad((1, 2)), network=100.0), now=0.0)
    inventory.register(register("plain", None), now=0.0)
    restored = Inventory(lease_ttl_s=10.0)
    restored.loads(inventory.dumps(), now=5.0)
    fast, plain = restored.get("fast"), restored.get("plain")
    assert fast is not None
    assert plain is not None
    assert fast.links == pair_links(register("x", quad((1, 2))))
    assert fast.network_gbps == 100.0
    assert fast.drain is None
    assert plain.links == ()
    assert plain.network_gbps is None
    assert len(json.loads(inventory.dumps())["plain"]) == 6  # nothing new written for a plain node
    old = json.dumps({"old": ["h", [0, 1], "inc", 8.0, 64.0, "V100"]})
    restored.loads(old, now=0.0)
    assert restored.get("old") is not None
    assert restored.get("old").links == ()


def test_the_topology_gives_policies_the_bandwidths_and_the_uplink() -> None:
    inventory = Inventory(lease_ttl_s=10.0)
    inventory.register(register("a", quad((0, 3)), network=25.0), now=0.0)
    inventory.register(register("b", None), now=0.0)
    cluster = Topology(inventory.live()).cluster()
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    assert a.link_bandwidth_gbps[(0, 3)] == a.link_bandwidth_gbps[(3, 0)] == NVLINK
    assert a.network_gbps == 25.0
    assert b.link_bandwidth_gbps == {}
    assert b.network_gbps == Node("x", ()).network_gbps


def test_the_snapshot_carries_links_to_the_placement_replica() -> None:
    nodes = [
        NodeInfo("node-a", (0, 1, 2, 3), links=((0, 3, NVLINK), (1, 2, NVLINK)), network_gbps=10.0),
        NodeInfo("node-b", (0, 1, 2, 3)),
    ]
    snapshot = Owner(nodes).encode(1_000.0)
    on_wire, _ = wire(snapshot)
    _, cluster = SnapshotReplica().apply(on_wire)
    a, b = cluster.nodes["node-a"], cluster.nodes["node-b"]
    assert a.link_bandwidth_gbps[(3, 0)] == NVLINK
    assert a.network_gbps == 10.0
    assert (0, 1) not in a.link_bandwidth_gbps
    assert b.link_bandwidth_gbps == {}
    assert b.network_gbps == Node("x", ()).network_gbps
    # a node without link facts sends nothing new on the wire
    _, data = wire(Owner([NodeInfo("plain", (0,))]).encode(1_000.0))
    assert b"network_gbps" not in data
    assert b"links" not in data


def test_a_change_of_links_alone_resends_the_nodes() -> None:
    owner = Owner([NodeInfo("node-a", (0, 1))])
    replica = SnapshotReplica()
    first = owner.encode(1_000.0)
    replica.apply(wire(first)[0])
    owner.writer.acknowledged("me", first.version)
    owner.nodes = [NodeInfo("node-a", (0, 1), links=((0, 1, 300.0),))]
    second = owner.encode(1_001.0)
    assert second.nodes is not None
    _, cluster = replica.apply(wire(second)[0])
    assert cluster.nodes["node-a"].link_bandwidth_gbps[(0, 1)] == 300.0


def test_a_zero_uplink_is_refused_at_the_register() -> None:
    """0 is "unknown" in the matrix but not a bandwidth for the uplink: kept, it would make every
    round's snapshot invalid at the placement (``SnapshotNode.network_gbps`` > 0)."""
    with pytest.raises(ValidationError):
        register("n", None, network=0.0)


@pytest.mark.parametrize("network", [None, 1e-6, 100_000.0], ids=["unknown", "tiny", "largest"])
def test_every_register_the_schema_accepts_gives_a_snapshot_the_placement_accepts(network: float | None) -> None:
    inventory = Inventory(lease_ttl_s=10.0)
    extreme = [[0.0 if i == j else 100_000.0 for j in range(4)] for i in range(4)]
    inventory.register(register("edge", extreme, network=network), now=0.0)
    restored = Inventory(lease_ttl_s=10.0)
    restored.loads(inventory.dumps(), now=1.0)  # what a new leader reads back
    on_wire, _ = wire(Owner(list(restored.live())).encode(1_000.0))
    _, cluster = SnapshotReplica().apply(on_wire)
    node = cluster.nodes["edge"]
    assert node.link_bandwidth_gbps[(0, 3)] == 100_000.0
    assert node.network_gbps == (network if network is not None else Node("x", ()).network_gbps)


def test_a_zero_uplink_stored_before_it_was_refused_reads_as_not_reported() -> None:
    stored = json.dumps({"old": ["h", [0, 1], "inc", 8.0, 64.0, "V100", None, {"links": [], "network_gbps": 0}]})
    inventory = Inventory(lease_ttl_s=10.0)
    inventory.loads(stored, now=0.0)
    node = inventory.get("old")
    assert node is not None
    assert node.network_gbps is None
    wire(Owner(list(inventory.live())).encode(1_000.0))  # the placement accepts the snapshot


@pytest.mark.parametrize(
    "links",
    [
        [{"a": 0, "b": 7, "gbps": 400.0}],  # GPU 7 is not the node's
        [{"a": 0, "b": 1, "gbps": 400.0}, {"a": 1, "b": 0, "gbps": 5.0}],  # the same pair twice
    ],
    ids=["foreign-gpu", "duplicate-pair"],
)
def test_a_snapshot_node_with_links_it_cannot_have_is_refused(links: list[dict[str, float]]) -> None:
    with pytest.raises(ValidationError):
        SnapshotNode.model_validate({"node_id": "n", "gpus": [0, 1, 2, 3], "links": links})
    assert SnapshotNode.model_validate({"node_id": "n", "gpus": [0, 1, 7], "links": links[:1]}).links
