"""Placement answers rounds again after the broker restarts (its own broker: the session's is shared
with other tests). It keeps nothing but the snapshot it last acknowledged, so it needs no replay."""

from __future__ import annotations

import asyncio
from pathlib import Path

from schemas.rounds import PlacementPlan
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from tests.helpers import eventually
from tests.integration.test_placement import Plans, acknowledge, launch, seeded


async def test_rounds_are_answered_after_the_broker_restarted(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "nats")
    await broker.astart()
    bus = await Bus.connect(broker.url, name="restart-test", options=BusOptions(namespace="restart"))
    service = PlacementService(PlacementConfig(nats=broker.url, namespace="restart"))
    plans = Plans()
    try:
        await service.start(bus)
        await bus.subscribe("placement.plan", PlacementPlan, plans)
        owner = seeded()
        first = owner.round(1, ["j2", "j3", "j1"])
        acknowledge(owner, await plans.answer(bus, first), first)
        await broker.astop()
        await broker.astart()
        await eventually(lambda: bus.nc.is_connected, timeout_s=20)
        # The delta to this instance's own subject still reaches it, against the base it kept.
        second = owner.round(2, ["j3", "j2", "j1"])
        assert second.to == service.replica_id
        plan = await plans.answer(bus, second, timeout_s=20)
        assert not plan.resync
        assert launch(plan) == {"j3": [("node-a", [2, 3])], "j2": [("node-b", [0, 1, 2, 3])]}
    finally:
        await service.stop()
        await bus.close()
        await asyncio.to_thread(broker.stop)
