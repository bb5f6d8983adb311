"""Admission's inventory keeps an agent's ``draining`` (heartbeats) and an operator's drain (the
scheduler) apart; ``draining`` is their OR (services/admission/inventory.py, issue 15 item 3)."""

from __future__ import annotations

import uuid

from schemas.nodes import GpuInventory, NodeHeartbeat, NodeRegister
from schemas.roles import Role
from services.admission.inventory import Inventory
from services.core.state import UNAVAILABLE


def register(node_id: str, incarnation: uuid.UUID, gpus: int = 2) -> NodeRegister:
    inventory = [GpuInventory(index=i, uuid=f"{node_id}-gpu-{i}", name="t", memory_mib=1) for i in range(gpus)]
    return NodeRegister(node_id=node_id, incarnation=incarnation, hostname="h", cpus=8, memory_gb=64, gpus=inventory)


def beat(node_id: str, incarnation: uuid.UUID, seq: int, *, draining: bool = False) -> NodeHeartbeat:
    return NodeHeartbeat(node_id=node_id, incarnation=incarnation, seq=seq, epoch_seen=0, draining=draining)


def draining(inventory: Inventory, node_id: str) -> bool:
    return inventory.nodes[node_id].draining


def free(inventory: Inventory) -> int:
    return inventory.build_cluster()[0].free_gpu_count


def test_a_heartbeat_does_not_lift_an_operator_drain() -> None:
    inc = uuid.uuid4()
    inventory = Inventory(lease_ttl_s=30)
    inventory.on_register(register("n0", inc), 0.0, draining=True)  # as query.admission said at the start
    assert not inventory.on_heartbeat(beat("n0", inc, 1), 1.0)  # the agent stays: nothing changes
    record = inventory.nodes["n0"]
    assert record.operator_drained
    assert record.draining
    assert free(inventory) == 0


def test_agent_and_operator_drains_are_separate() -> None:
    inc = uuid.uuid4()
    inventory = Inventory(lease_ttl_s=30)
    inventory.on_register(register("n0", inc), 0.0)
    assert free(inventory) == 2
    assert inventory.on_heartbeat(beat("n0", inc, 1, draining=True), 1.0)  # the agent leaves
    assert inventory.set_operator_drains({"n0": True}) == []  # drained already: no change to draining
    assert inventory.set_operator_drains({"n0": False}) == []  # the agent still leaves
    assert draining(inventory, "n0")
    assert inventory.set_operator_drains({"n0": True}) == []
    assert inventory.on_heartbeat(beat("n0", inc, 2), 2.0) is False  # the operator's drain holds it
    version = inventory.version
    assert inventory.set_operator_drains({"n0": False, "unknown": True}) == ["n0"]
    assert inventory.version > version
    assert not draining(inventory, "n0")
    assert free(inventory) == 2


def test_an_operator_drain_outlives_a_new_incarnation() -> None:
    inventory = Inventory(lease_ttl_s=30)
    inventory.on_register(register("n0", uuid.uuid4()), 0.0)
    inventory.set_operator_drains({"n0": True})
    restarted = uuid.uuid4()
    assert inventory.on_register(register("n0", restarted), 1.0)  # the agent restarted
    assert inventory.nodes["n0"].operator_drained
    cluster, _ = inventory.build_cluster()
    assert all(jobs == (UNAVAILABLE,) for jobs in cluster.gpu_jobs)


def test_admission_may_ask_query_nodes_on_its_own_token_only() -> None:
    """The drain refresh (services/admission/drains.py) asks as its identity, named after the role."""
    from services.admission.drains import REQUESTER
    from tests.unit.test_roles import may_publish

    assert Role.ADMISSION.value == REQUESTER
    assert may_publish(Role.ADMISSION, REQUESTER, "query.nodes.admission")
    assert not may_publish(Role.ADMISSION, REQUESTER, "query.nodes.alice")
    assert not may_publish(Role.ADMISSION, REQUESTER, "operator.drain.admission")
