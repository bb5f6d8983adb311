"""Gavel on the live cluster (issue 17, item 2): each job lands on the GPU type its model runs fastest on.

Real parts: a nats-server, the scheduler ranking with ``gavel``, the placement service running
``gavel``, admission, and two emulating worker agents (processes) with one fake GPU each, named as a
driver would name them (``--fake-gpu-name``): ``k80-node`` reports "Tesla K80", ``v100-node``
"Tesla V100-SXM2-16GB". The scheduler must normalise the names to ``k80`` and ``v100`` (the
placement service's snapshot shows what it placed on), and Gavel's LP must put a lone CycleGAN job
(8.8x faster on a V100 in Gavel's table) on the V100 and a lone Recommendation job (faster on a K80
in that table) on the K80: the opposite nodes, so neither is an accident of node order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.runtime.broker import Broker
from tests.helpers import eventually
from tests.live_parts import LiveParts, emulated_job, live_parts

NODES = {"k80-node": "Tesla K80", "v100-node": "Tesla V100-SXM2-16GB"}


@pytest.fixture
async def cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LiveParts]:
    async with live_parts(broker, tmp_path_factory.mktemp("gavel")) as parts:
        leader = await parts.start_scheduler(policy="gavel")
        await eventually(lambda: leader.is_leader, 15, "a leading scheduler")
        await parts.start_placement("gavel")
        for node_id, name in NODES.items():
            await parts.start_worker(node_id, 1, "--fake-gpu-name", name)
        await eventually(lambda: all(n in leader.inventory for n in NODES), 15, "both nodes registered")
        await parts.start_admission()
        yield parts


async def _node_of(parts: LiveParts, job_id: str) -> list[str]:
    view = await parts.until_status(job_id, "running", timeout_s=30)
    return sorted(view.placement)


@pytest.mark.timeout(120)
async def test_each_job_lands_on_its_fastest_gpu_type(cluster: LiveParts) -> None:
    leader = cluster.schedulers[0]
    assert {n: leader.inventory.get(n).gpu_type for n in NODES} == {  # type: ignore[union-attr]
        "k80-node": "k80",
        "v100-node": "v100",
    }

    cyclegan = await cluster.submit(emulated_job("cyclegan", seconds=100_000, model="cyclegan"))
    assert await _node_of(cluster, cyclegan) == ["v100-node"]
    # Alone again: with both jobs Gavel's max-min split would rotate them over the two types.
    await cluster.client.cancel(cyclegan)
    await cluster.until_status(cyclegan, "cancelled", timeout_s=30)

    recoder = await cluster.submit(emulated_job("recoder", seconds=100_000, model="recoder"))
    assert await _node_of(cluster, recoder) == ["k80-node"]

    placement = cluster.placements[0]
    seen = placement.replica.cluster
    assert seen is not None
    assert {n.node_id: n.gpu_type for n in seen.nodes.values()} == {"k80-node": "k80", "v100-node": "v100"}
    assert placement.plans > 0
