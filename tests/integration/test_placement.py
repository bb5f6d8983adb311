"""The placement service against a real nats-server: per-node plans, preemption, liveness, replay
after a restart, and the service as a child process (``python -m services.placement``)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from schemas.job import JobSpec
from schemas.jobs import JobArrived, JobCompleted, JobStarted, JobSuspended, SuspendReason
from schemas.nodes import NodeHeartbeat
from schemas.rounds import NodeGpus, PlacementPlan, ScheduleRound
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.helpers import eventually, fake_node

REPO = Path(__file__).resolve().parents[2]


def arrived(job_id: str, gpus: int) -> JobArrived:
    return JobArrived(job_id=job_id, spec=JobSpec(name=job_id, command=["python", "train.py"], gpus=gpus))


def started(job_id: str, node_id: str, gpus: list[int], lease: str | None = None) -> JobStarted:
    return JobStarted(job_id=job_id, lease_id=lease or f"lease-{job_id}", node_id=node_id, epoch=1, gpus=gpus)


def round_of(ranked: list[str], number: int = 1, **extra: object) -> ScheduleRound:
    return ScheduleRound(round=number, state_version=number, epoch=1, ranked=ranked, **extra)


class Plans:
    """Collects plans published on placement.plan."""

    def __init__(self) -> None:
        self.got: list[PlacementPlan] = []

    async def __call__(self, plan: PlacementPlan) -> None:
        self.got.append(plan)

    async def answer(self, bus: Bus, round_: ScheduleRound, timeout_s: float = 10.0) -> PlacementPlan:
        """Publish ``round_`` (again, until answered: a just-started service may miss the first)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            await bus.publish("schedule.round", round_)
            for _ in range(25):
                for plan in self.got:
                    if plan.round == round_.round and plan.state_version == round_.state_version:
                        return plan
                await asyncio.sleep(0.02)
            if asyncio.get_running_loop().time() > deadline:
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
    yield svc
    await svc.stop()


async def seed(bus: Bus) -> None:
    """Two 4-GPU nodes; j1 (2 GPUs) runs on node-a GPUs 0-1; j2 (4) and j3 (2) wait."""
    await bus.publish("node.register", fake_node("node-a", 4))
    await bus.publish("node.register", fake_node("node-b", 4))
    for job_id, gpus in (("j1", 2), ("j2", 4), ("j3", 2)):
        await bus.publish("job.arrived", arrived(job_id, gpus))
    await bus.publish("job.started", started("j1", "node-a", [0, 1]))


def launch(plan: PlacementPlan) -> dict[str, list[tuple[str, list[int]]]]:
    return {job: [(part.node_id, part.gpus) for part in parts] for job, parts in plan.launch.items()}


async def test_answers_a_round_with_gpus_named_per_node(bus: Bus, plans: Plans, service: PlacementService) -> None:
    await seed(bus)
    await service.start(bus)
    plan = await plans.answer(bus, round_of(["j2", "j3", "j1"], 7))
    assert (plan.round, plan.state_version, plan.epoch, plan.policy) == (7, 7, 1, "consolidated")
    # consolidated: j2 (4) takes the whole free node-b; j3 (2) the best fit, node-a's free pair.
    assert launch(plan) == {"j2": [("node-b", [0, 1, 2, 3])], "j3": [("node-a", [2, 3])]}
    assert plan.suspend == []
    assert service.stats()["plans"] >= 1


async def test_suspends_the_lowest_ranked_running_job_for_a_higher_ranked_one(
    bus: Bus, plans: Plans, service: PlacementService
) -> None:
    await seed(bus)
    await bus.publish("job.started", started("j2", "node-b", [0, 1, 2, 3]))
    await bus.publish("job.arrived", arrived("j4", 4))
    await service.start(bus)
    await eventually(lambda: "j4" in service.view.jobs)
    plan = await plans.answer(bus, round_of(["j4", "j1", "j2"], 2))
    assert plan.suspend == ["j2"]
    assert launch(plan) == {"j4": [("node-b", [0, 1, 2, 3])]}


async def test_follows_facts_after_start_and_spans_nodes_for_a_wide_job(
    bus: Bus, plans: Plans, service: PlacementService
) -> None:
    await service.start(bus)
    await seed(bus)
    await bus.publish("job.completed", JobCompleted(job_id="j1", lease_id="lease-j1", node_id="node-a", epoch=1,
                                                    iteration=10))  # fmt: skip
    await bus.publish("job.arrived", arrived("wide", 6))
    await eventually(lambda: "wide" in service.view.jobs and "j1" not in service.view.leases)
    plan = await plans.answer(bus, round_of(["wide"], 3))
    parts = launch(plan)["wide"]
    assert sorted(node for node, _ in parts) == ["node-a", "node-b"]
    assert sum(len(gpus) for _, gpus in parts) == 6


async def test_a_silent_node_is_left_out_and_a_heartbeat_brings_it_back(
    broker: Broker, bus: Bus, plans: Plans, namespace: str
) -> None:
    svc = PlacementService(config(broker, namespace, lease_ttl_s=0.3, sweep_interval_s=0.05))
    reg = fake_node("node-z", 2)
    await bus.publish("node.register", reg)
    await bus.publish("job.arrived", arrived("small", 1))
    await svc.start(bus)
    try:
        await eventually(lambda: not svc.view.inventory.is_live("node-z"))
        plan = await plans.answer(bus, round_of(["small"], 1))
        assert plan.launch == {}
        heartbeat = NodeHeartbeat(node_id="node-z", incarnation=reg.incarnation, seq=1, epoch_seen=1)
        await bus.publish("node.heartbeat", heartbeat)
        await eventually(lambda: svc.view.inventory.is_live("node-z"))
        plan = await plans.answer(bus, round_of(["small"], 2))
        assert plan.launch == {"small": [NodeGpus(node_id="node-z", gpus=[0])]}
    finally:
        await svc.stop()


async def test_rebuilds_its_view_by_replay_after_a_restart(
    broker: Broker, bus: Bus, plans: Plans, namespace: str
) -> None:
    first = PlacementService(config(broker, namespace))
    await first.start(bus)
    await seed(bus)
    await bus.publish("job.suspended", JobSuspended(job_id="j1", lease_id="lease-j1", node_id="node-a", epoch=1,
                                                    reason=SuspendReason.PREEMPTED, iteration=5))  # fmt: skip
    await bus.publish("job.started", started("j3", "node-b", [2, 3], lease="lease-j3"))
    await eventually(lambda: "j3" in first.view.leases and "j1" not in first.view.leases)
    before = await plans.answer(bus, round_of(["j3", "j2", "j1"], 1))
    await first.stop()

    second = PlacementService(config(broker, namespace))
    await second.start(bus)
    try:
        assert set(second.view.leases) == {"j3"}
        assert set(second.view.jobs) == {"j1", "j2", "j3"}
        after = await plans.answer(bus, round_of(["j3", "j2", "j1"], 2))
    finally:
        await second.stop()
    assert launch(after) == launch(before)
    # j3 keeps node-b 2-3; j2 (4) fits only node-a; j1 (2) then takes node-b 0-1.
    assert launch(after) == {"j2": [("node-a", [0, 1, 2, 3])], "j1": [("node-b", [0, 1])]}


async def test_runs_as_a_child_process_and_stops_on_sigterm(
    broker: Broker, bus: Bus, plans: Plans, namespace: str
) -> None:
    await seed(bus)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.placement", "--nats", broker.url, "--namespace", namespace,
        "--policy", "first-free", "--log-format", "text",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        plan = await plans.answer(bus, round_of(["j3"], 1), timeout_s=30)
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


def test_a_completion_for_an_earlier_lease_ends_the_job_when_its_newer_lease_ends() -> None:
    """The job was requeued as lost and runs under a newer lease when its earlier run's completion
    lands: the scheduler revokes the re-run, so the view keeps its GPUs taken until that lease ends,
    then forgets the job. A failure of an earlier run changes nothing."""
    from schemas.jobs import FailureReason, JobFailed
    from services.placement.view import ClusterView

    view = ClusterView(lease_ttl_s=30.0)
    view.apply(fake_node("node-a", 2), 0.0)
    view.apply(arrived("j", 1), 0.0)
    view.apply(started("j", "node-a", [0], lease="old"), 0.0)
    view.apply(started("j", "node-a", [1], lease="new"), 0.0)
    view.apply(JobFailed(job_id="j", lease_id="old", node_id="node-a", epoch=1, reason=FailureReason.EXIT_CODE,
                         exit_code=1), 0.0)  # fmt: skip
    assert view.leases["j"].lease_id == "new"
    view.apply(JobCompleted(job_id="j", lease_id="old", node_id="node-a", epoch=1, iteration=10), 0.0)
    assert view.leases["j"].lease_id == "new"
    assert "j" in view.jobs
    assert view.cluster().free_by_node() == {0: {0}}
    view.apply(JobSuspended(job_id="j", lease_id="new", node_id="node-a", epoch=1, reason=SuspendReason.PREEMPTED,
                            iteration=3), 0.0)  # fmt: skip
    assert "j" not in view.leases
    assert "j" not in view.jobs


def test_the_view_counts_a_job_s_suspensions_as_preemptions_once_each() -> None:
    """Victim policies read ``preemptions`` (FitGpp's ``PC_j < P``) from the placement's view."""
    from services.placement.view import ClusterView

    view = ClusterView(lease_ttl_s=30.0)
    view.apply(fake_node("node-a", 1), 0.0)
    view.apply(arrived("j", 1), 0.0)
    for n in (1, 2):
        view.apply(started("j", "node-a", [0], lease=f"l{n}"), 0.0)
        suspended = JobSuspended(job_id="j", lease_id=f"l{n}", node_id="node-a", epoch=1,
                                 reason=SuspendReason.PREEMPTED, iteration=n)  # fmt: skip
        view.apply(suspended, 0.0)
        view.apply(suspended, 0.0)  # a replayed fact counts once
        assert view.jobs["j"].preemptions == n
