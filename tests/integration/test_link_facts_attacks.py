"""Hostile link facts on ``node.register`` reach nothing (issue 17 network model, review).

Real parts: a nats-server, the scheduler, admission, the placement service running
``bandwidth-aware`` and one emulating worker agent (``node-a``, 4 fake GPUs, GPUs 2-3 the fast
pair). An attacker on the bus (a raw NATS client, ``tests.attacker``: no Roundhouse codec to stop it)
registers ``node-evil`` with link facts the schema must refuse: a zero uplink (which, kept, made
every round's snapshot invalid at the placement), NaN, a bandwidth past the bound, a matrix for GPUs
the node does not have, an asymmetric one and an oversized one. Each must be dead-lettered by the
scheduler's register consumer, nothing of ``node-evil`` may be kept (inventory, its persisted
form), and placement must go on using the real node's facts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from schemas.nodes import GpuInventory, NodeRegister
from schemas.subjects import NODE_REGISTER
from services.runtime.broker import Broker
from tests.attacker import Attacker
from tests.helpers import eventually
from tests.live_parts import LiveParts, emulated_job, live_parts

LINKS = "0-1=100,0-2=100,0-3=100,1-2=100,1-3=100,2-3=400"
EVIL = "node-evil"


def _valid_register() -> dict[str, Any]:
    gpus = [GpuInventory(index=i, uuid=f"GPU-evil-{i}", name="V100", memory_mib=16_384) for i in range(4)]
    register = NodeRegister(node_id=EVIL, incarnation=uuid.uuid4(), hostname="evil", cpus=8, memory_gb=64, gpus=gpus)
    return register.model_dump(mode="json")


def _square(n: int, value: float = 100.0) -> list[list[float]]:
    return [[0.0 if i == j else value for j in range(n)] for i in range(n)]


def _asymmetric() -> list[list[float]]:
    m = _square(4)
    m[0][1] = 5_000.0
    return m


HOSTILE: dict[str, bytes] = {
    "zero uplink": json.dumps({**_valid_register(), "network_gbps": 0}).encode(),
    "NaN uplink": json.dumps({**_valid_register(), "network_gbps": "__NAN__"}).replace('"__NAN__"', "NaN").encode(),
    "huge bandwidth": json.dumps({**_valid_register(), "link_bandwidth_gbps": _square(4, 1e9)}).encode(),
    "links for GPUs it lacks": json.dumps({**_valid_register(), "link_bandwidth_gbps": _square(6)}).encode(),
    "asymmetric": json.dumps({**_valid_register(), "link_bandwidth_gbps": _asymmetric()}).encode(),
    "oversized": json.dumps({**_valid_register(), "link_bandwidth_gbps": _square(65)}).encode(),
}


@pytest.fixture
async def cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LiveParts]:
    async with live_parts(broker, tmp_path_factory.mktemp("link-attacks")) as parts:
        leader = await parts.start_scheduler()
        await eventually(lambda: leader.is_leader, 15, "a leading scheduler")
        await parts.start_worker("node-a", 4, "--link-bandwidth-gbps", LINKS, "--network-gbps", "25")
        await eventually(lambda: "node-a" in leader.inventory, 15, "node-a registered")
        await parts.start_admission()
        yield parts


@pytest.mark.timeout(120)
async def test_hostile_link_facts_are_dead_lettered_and_placement_goes_on(cluster: LiveParts) -> None:
    (leader,) = cluster.schedulers
    term = leader._term
    assert term is not None
    registers = term.consumer_for[NODE_REGISTER]
    before = registers.stats.dead_lettered
    attacker = await Attacker.connect(cluster.broker.url, namespace=cluster.namespace)
    try:
        for payload in HOSTILE.values():
            await attacker.publish(f"node.register.{EVIL}", payload)
    finally:
        await attacker.close()
    await eventually(
        lambda: registers.stats.dead_lettered - before == len(HOSTILE), 30, "every hostile register dead-lettered"
    )
    assert EVIL not in leader.inventory
    assert EVIL not in leader.inventory.dumps()

    # Placement still runs, on the real node's facts: the fast pair.
    placement = await cluster.start_placement("bandwidth-aware")
    job = await cluster.submit(emulated_job("pair", gpus=2, seconds=100_000))
    view = await cluster.until_status(job, "running", timeout_s=30)
    assert {node: list(gpus) for node, gpus in view.placement.items()} == {"node-a": [2, 3]}
    seen = placement.replica.cluster
    assert seen is not None
    assert set(seen.nodes) == {"node-a"}
    assert seen.nodes["node-a"].network_gbps == 25.0
