"""A round that ranks a job the placement view has not read yet waits for it (``spec_wait_s``)
instead of leaving it out: real nats-server, the real placement service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from schemas.rounds import PlacementPlan
from services.placement.service import PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.helpers import eventually, fake_node
from tests.integration.test_placement import Plans, arrived, config, launch, round_of


@pytest.fixture
async def plans(bus: Bus) -> Plans:
    collected = Plans()
    await bus.subscribe("placement.plan", PlacementPlan, collected)
    return collected


@pytest.fixture
async def started_service(broker: Broker, bus: Bus, namespace: str) -> AsyncIterator[PlacementService]:
    svc = PlacementService(config(broker, namespace, spec_wait_s=2.0))
    await bus.publish("node.register", fake_node("node-a", 2))
    await svc.start(bus)
    await eventually(lambda: "node-a" in svc.view.inventory.nodes)
    yield svc
    await svc.stop()


async def test_a_round_waits_for_a_job_its_view_reads_late(
    bus: Bus, plans: Plans, started_service: PlacementService
) -> None:
    await bus.publish("schedule.round", round_of(["late"], 1))
    await asyncio.sleep(0.3)  # the round is in, waiting; then the job's arrival is read
    assert not plans.got
    await bus.publish("job.arrived", arrived("late", 1))
    await eventually(lambda: bool(plans.got))
    assert launch(plans.got[0]) == {"late": [("node-a", [0])]}
    assert started_service.unknown_jobs == 0


async def test_a_job_the_view_never_reads_is_left_out_after_the_wait(
    broker: Broker, bus: Bus, plans: Plans, namespace: str
) -> None:
    svc = PlacementService(config(broker, namespace, spec_wait_s=0.2))
    await bus.publish("node.register", fake_node("node-a", 2))
    await bus.publish("job.arrived", arrived("known", 1))
    await svc.start(bus)
    try:
        await eventually(lambda: "known" in svc.view.jobs)
        plan = await plans.answer(bus, round_of(["ghost", "known"], 2))
        assert launch(plan) == {"known": [("node-a", [0])]}
        assert svc.unknown_jobs >= 1
    finally:
        await svc.stop()
