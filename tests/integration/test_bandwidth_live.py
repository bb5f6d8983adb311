"""Link bandwidths registered by real worker agents drive the real ``bandwidth-aware`` placement (issue 17).

Real parts: a nats-server, the scheduler, admission, the placement service running
``bandwidth-aware``, and two emulating worker agents (processes) with four fake GPUs each. ``node-a``
registers ``--link-bandwidth-gbps`` with one well-connected pair (GPUs 2-3, 400 Gb/s; every other
pair 100 Gb/s) and a 25 Gb/s uplink; ``node-b`` registers none. The registers' facts must reach the
placement service's snapshot (``Node.link_bandwidth_gbps``, ``network_gbps``), and a 2-GPU job must
land on node-a's GPUs 2 and 3, where ``consolidated`` takes the lowest-numbered pair (0 and 1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services.core.state import Node
from services.runtime.broker import Broker
from tests.helpers import eventually
from tests.live_parts import LiveParts, emulated_job, live_parts

LINKS = "0-1=100,0-2=100,0-3=100,1-2=100,1-3=100,2-3=400"
"""node-a: GPUs 2 and 3 are the well-connected pair."""


@pytest.fixture
async def cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LiveParts]:
    async with live_parts(broker, tmp_path_factory.mktemp("bandwidth")) as parts:
        leader = await parts.start_scheduler()
        await eventually(lambda: leader.is_leader, 15, "a leading scheduler")
        await parts.start_worker("node-a", 4, "--link-bandwidth-gbps", LINKS, "--network-gbps", "25")
        await parts.start_worker("node-b", 4)
        await eventually(lambda: "node-a" in leader.inventory and "node-b" in leader.inventory, 15, "both nodes")
        await parts.start_admission()
        yield parts


async def _placed(parts: LiveParts, job_id: str) -> dict[str, list[int]]:
    view = await parts.until_status(job_id, "running", timeout_s=30)
    return {node: list(gpus) for node, gpus in view.placement.items()}


@pytest.mark.timeout(120)
async def test_a_two_gpu_job_goes_to_the_well_connected_pair(cluster: LiveParts) -> None:
    placement = await cluster.start_placement("bandwidth-aware")
    job = await cluster.submit(emulated_job("pair", gpus=2, seconds=100_000))
    assert await _placed(cluster, job) == {"node-a": [2, 3]}

    # what the placement service placed on: the registers' facts, in its snapshot
    seen = placement.replica.cluster
    assert seen is not None
    node_a, node_b = seen.nodes["node-a"], seen.nodes["node-b"]
    assert node_a.link_bandwidth_gbps[(2, 3)] == node_a.link_bandwidth_gbps[(3, 2)] == 400.0
    assert node_a.link_bandwidth_gbps[(0, 1)] == 100.0
    assert node_a.network_gbps == 25.0
    assert node_b.link_bandwidth_gbps == {}
    assert node_b.network_gbps == Node("x", ()).network_gbps  # not reported: the default
    assert placement.plans > 0


@pytest.mark.timeout(120)
async def test_consolidated_ignores_the_links_and_takes_the_lowest_pair(cluster: LiveParts) -> None:
    """The control: the same cluster and job under ``consolidated`` land elsewhere, so the pair above
    was the bandwidth-aware policy's choice and not an accident of GPU numbering."""
    await cluster.start_placement("consolidated")
    job = await cluster.submit(emulated_job("pair", gpus=2, seconds=100_000))
    assert await _placed(cluster, job) == {"node-a": [0, 1]}
