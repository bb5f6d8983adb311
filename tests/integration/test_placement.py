"""The placement service against a real nats-server: it places each round on the snapshot the round
carries (full, then deltas to its own subject), names GPUs per node, refuses a bad round at once with
the reason, and runs as a child process (``python -m services.placement``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.rounds import PlacementPlan, ScheduleRound
from schemas.subjects import schedule_round
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.round_builders import NOW, NodeInfo, Owner, job

REPO = Path(__file__).resolve().parents[2]


class Plans:
    """Collects plans published on placement.plan."""

    def __init__(self) -> None:
        self.got: list[PlacementPlan] = []
        self.arrived = asyncio.Event()

    async def __call__(self, plan: PlacementPlan) -> None:
        self.got.append(plan)
        self.arrived.set()

    async def answer(self, bus: Bus, round_: ScheduleRound, timeout_s: float = 10.0) -> PlacementPlan:
        """Publish ``round_`` where the scheduler would (its peer's subject for a delta) and wait for
        the plan; a just-started child process may miss the first, so a full round is re-sent."""
        subject = schedule_round(round_.to)
        deadline = time.monotonic() + timeout_s
        while True:
            await bus.publish(subject, round_)
            resend_at = time.monotonic() + 0.5
            while time.monotonic() < resend_at:
                for plan in self.got:
                    if (plan.round, plan.state_version) == (round_.round, round_.state_version):
                        return plan
                self.arrived.clear()
                with_timeout = max(0.0, resend_at - time.monotonic())
                try:
                    await asyncio.wait_for(self.arrived.wait(), with_timeout)
                except TimeoutError:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"no plan for round {round_.round}")


@pytest.fixture
async def plans(bus: Bus) -> Plans:
    collected = Plans()
    await bus.subscribe("placement.plan", PlacementPlan, collected)
    return collected


def config(broker: Broker, namespace: str, **extra: object) -> PlacementConfig:
    return PlacementConfig(nats=broker.url, namespace=namespace, **extra)


@pytest.fixture
async def service(broker: Broker, bus: Bus, namespace: str) -> AsyncIterator[PlacementService]:
    svc = PlacementService(config(broker, namespace))
    await svc.start(bus)
    yield svc
    await svc.stop()


def seeded() -> Owner:
    """Two 4-GPU nodes; j1 (2 GPUs) runs on node-a GPUs 0-1; j2 (4) and j3 (2) wait."""
    owner = Owner([NodeInfo("node-a", (0, 1, 2, 3)), NodeInfo("node-b", (0, 1, 2, 3))])
    for seq, (job_id, gpus) in enumerate((("j1", 2), ("j2", 4), ("j3", 2)), start=1):
        owner.jobs[job_id] = job(job_id, gpus=gpus, seq=seq)
    owner.run(owner.jobs["j1"], (0, 1), service0=0.0, executed0=0.0, start=NOW - 10)
    return owner


def launch(plan: PlacementPlan) -> dict[str, list[tuple[str, list[int]]]]:
    return {job: [(part.node_id, part.gpus) for part in parts] for job, parts in plan.launch.items()}


def acknowledge(owner: Owner, plan: PlacementPlan, round_: ScheduleRound) -> None:
    assert plan.instance is not None
    assert round_.snapshot is not None
    owner.writer.acknowledged(plan.instance, round_.snapshot.version)


async def test_answers_a_round_with_gpus_named_per_node(bus: Bus, plans: Plans, service: PlacementService) -> None:
    plan = await plans.answer(bus, seeded().round(7, ["j2", "j3", "j1"]))
    assert (plan.round, plan.state_version, plan.epoch, plan.policy) == (7, 7, 1, "consolidated")
    # consolidated: j2 (4) takes the whole free node-b; j3 (2) the best fit, node-a's free pair.
    assert launch(plan) == {"j2": [("node-b", [0, 1, 2, 3])], "j3": [("node-a", [2, 3])]}
    assert plan.suspend == []
    assert plan.instance == service.replica_id
    assert service.stats()["plans"] == 1


async def test_deltas_go_to_the_instance_that_answered_and_a_lost_base_asks_for_a_resync(
    bus: Bus, plans: Plans, service: PlacementService
) -> None:
    owner = seeded()
    first = owner.round(1, ["j2", "j3", "j1"])
    acknowledge(owner, await plans.answer(bus, first), first)
    # j2 started on node-b, j4 arrived: LAS-like ranking puts j4 first; the delta carries two jobs.
    owner.run(owner.jobs["j2"], (4, 5, 6, 7), service0=0.0, executed0=0.0, start=NOW)
    owner.jobs["j4"] = job("j4", gpus=4, seq=4)
    second = owner.round(2, ["j4", "j1", "j2"], now=NOW + 5)
    assert second.to == service.replica_id
    assert second.snapshot is not None
    assert first.snapshot is not None
    assert second.snapshot.base == first.snapshot.version
    assert sorted(row.job_id for row in second.snapshot.jobs) == ["j2", "j4"]
    plan = await plans.answer(bus, second)
    assert plan.suspend == ["j2"]
    assert launch(plan) == {"j4": [("node-b", [0, 1, 2, 3])]}
    # A delta against a base this instance never held is answered with resync, placing nothing.
    owner.writer.acknowledged(service.replica_id, 10_000)
    stale = second.model_copy(update={"round": 3, "state_version": 3,
                                      "snapshot": second.snapshot.model_copy(update={"base": 10_000})})  # fmt: skip
    answer = await plans.answer(bus, stale)
    assert answer.resync
    assert answer.launch == {}
    assert service.resyncs == 1


async def test_a_round_that_ranks_an_unknown_job_is_refused_at_once_and_good_rounds_still_run(
    bus: Bus, plans: Plans, service: PlacementService
) -> None:
    owner = seeded()
    began = time.monotonic()
    for number in range(1, 21):  # a flood of bad rounds costs nothing per round
        bad = owner.round(number, ["ghost", "j2"])
        refused = await plans.answer(bus, bad)
        assert refused.error is not None
        assert "ghost" in refused.error
        assert refused.launch == {}
        owner.writer.forget()  # the scheduler does too, on an error
    good = await plans.answer(bus, owner.round(99, ["j2", "j3", "j1"]))
    assert launch(good) == {"j2": [("node-b", [0, 1, 2, 3])], "j3": [("node-a", [2, 3])]}
    assert service.round_errors == 20
    assert time.monotonic() - began < 10  # nothing waits: 21 round trips, each answered at once


async def test_a_fill_round_only_puts_waiting_jobs_on_free_gpus(
    bus: Bus, plans: Plans, service: PlacementService
) -> None:
    owner = seeded()
    owner.run(owner.jobs["j2"], (4, 5, 6, 7), service0=0.0, executed0=0.0, start=NOW)
    owner.jobs["big"] = job("big", gpus=4, seq=9)
    plan = await plans.answer(bus, owner.round(1, ["j3", "big", "j1", "j2"], fill_only=True, preempt=False))
    assert plan.suspend == []
    assert launch(plan) == {"j3": [("node-a", [2, 3])]}


async def test_a_round_without_a_snapshot_is_refused_with_the_reason(
    bus: Bus, plans: Plans, service: PlacementService
) -> None:
    plan = await plans.answer(bus, ScheduleRound(epoch=1, round=5, state_version=5, ranked=["j1"]))
    assert plan.error is not None
    assert "no snapshot" in plan.error


async def test_runs_as_a_child_process_and_stops_on_sigterm(
    broker: Broker, bus: Bus, plans: Plans, namespace: str
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.placement", "--nats", broker.url, "--namespace", namespace,
        "--policy", "first-free", "--log-format", "text",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        plan = await plans.answer(bus, seeded().round(1, ["j3"]), timeout_s=30)
        assert plan.policy == "first-free"
        assert plan.gpu_count("j3") == 2
        child.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(child.communicate(), 15)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, stderr.decode()
    assert "placement service stopped" in stderr.decode()
