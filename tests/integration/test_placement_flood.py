"""Issue 13, attack 12: a flood of rounds naming unknown jobs costs placement nothing.

Placement once waited ``spec_wait_s`` for the spec of each job a round named and it lacked: 38 bad
rounds held good jobs back by 3 minutes. Now a round carries its snapshot and a round naming a job
that snapshot lacks is an error of that round, answered at once; a good round published behind 200
bad ones gets its plan within a fraction of a second, against a real nats-server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from schemas.rounds import PlacementPlan
from schemas.subjects import PLACEMENT_PLAN, schedule_round
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_placement import launch, seeded

BAD_ROUNDS = 200


@pytest.fixture
async def service(broker: Broker, bus: Bus, namespace: str) -> AsyncIterator[PlacementService]:
    svc = PlacementService(PlacementConfig(nats=broker.url, namespace=namespace))
    await svc.start(bus)
    await bus.nc.flush()
    yield svc
    await svc.stop()


async def test_a_flood_of_rounds_naming_unknown_jobs_delays_no_good_round(bus: Bus, service: PlacementService) -> None:
    plans: dict[int, PlacementPlan] = {}
    good_plan = asyncio.Event()
    good_round = BAD_ROUNDS + 1

    async def collect(plan: PlacementPlan) -> None:
        plans[plan.round] = plan
        if plan.round == good_round:
            good_plan.set()

    await bus.subscribe(PLACEMENT_PLAN, PlacementPlan, collect)
    await bus.nc.flush()
    owner = seeded()
    began = time.monotonic()
    for number in range(1, BAD_ROUNDS + 1):  # published back to back, nobody waits for an answer
        bad = owner.round(number, [f"ghost-{number}", "j2"])
        await bus.publish(schedule_round(bad.to), bad)
        owner.writer.forget()  # as the scheduler does on a round's error: the next one is full
    good = owner.round(good_round, ["j2", "j3", "j1"])
    await bus.publish(schedule_round(good.to), good)
    await asyncio.wait_for(good_plan.wait(), timeout=10)
    elapsed = time.monotonic() - began
    plan = plans[good_round]
    assert plan.error is None
    assert launch(plan) == {"j2": [("node-b", [0, 1, 2, 3])], "j3": [("node-a", [2, 3])]}
    # Every bad round was answered, as an error naming the job, and placed nothing.
    await _wait_until(lambda: len(plans) == BAD_ROUNDS + 1)
    for number in range(1, BAD_ROUNDS + 1):
        refused = plans[number]
        assert refused.error is not None
        assert f"ghost-{number}" in refused.error
        assert refused.launch == {}
        assert refused.suspend == []
    assert service.round_errors == BAD_ROUNDS
    # No per-round wait: 201 rounds on 3 jobs take milliseconds each; 5 s is a loaded CI machine's margin.
    assert elapsed < 5.0, f"the good round's plan came {elapsed:.2f} s after the flood began"


async def _wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not every round was answered"
        await asyncio.sleep(0.01)
