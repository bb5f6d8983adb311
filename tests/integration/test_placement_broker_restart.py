"""Placement's view keeps following the stream across a broker restart (its own broker: the
session's is shared with other tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from tests.helpers import eventually, fake_node
from tests.integration.test_placement import arrived, started


async def test_the_view_follows_facts_published_after_the_broker_restarted(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "nats")
    await broker.astart()
    bus = await Bus.connect(broker.url, name="restart-test", options=BusOptions(namespace="restart"))
    service = PlacementService(PlacementConfig(nats=broker.url, namespace="restart"))
    try:
        await bus.publish("node.register", fake_node("node-a", 4))
        await bus.publish("job.arrived", arrived("before", 1))
        await service.start(bus)
        assert set(service.view.jobs) == {"before"}
        await broker.astop()
        await broker.astart()
        await eventually(lambda: bus.nc.is_connected and service._follower is not None
                          and service._follower.stats.restarts >= 1, timeout_s=20)  # fmt: skip
        # The stream (file storage) survived; facts published now reach the view, none twice.
        await bus.publish("job.arrived", arrived("after", 2))
        await bus.publish("job.started", started("after", "node-a", [2, 3]))
        await eventually(lambda: "after" in service.view.leases, timeout_s=20)
        assert set(service.view.jobs) == {"before", "after"}
        cluster = service.view.cluster()
        assert cluster.free_gpu_count == 2
        assert service.replay_stats.handled == 2
    finally:
        await service.stop()
        await bus.close()
        await asyncio.to_thread(broker.stop)
