"""Live equals simulated: every round of a running cluster — the scheduler, the bus and the real
placement service — gives the plan that the simulator's round functions (``services.core.round``:
``rank_step`` then ``place_step``) give on the same snapshot.

An observer on the bus rebuilds each round's snapshot from the messages alone (full, then deltas, as
the placement instance does) and runs both halves of the round on it with fresh policy instances fed
the same sequence of rounds. The ranking it computes must equal the one the scheduler published (so
the snapshot holds everything the ranking read), and the plan must equal the service's. Every
registered placement policy runs once inside the real service (issue 18), under LAS; a few
scheduling policies run with the default placement.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from schemas.job import JobClass, JobSpec
from schemas.rounds import PlacementPlan, ScheduleRound
from schemas.subjects import PLACEMENT_PLAN, SCHEDULE_ROUND
from services.core.decisions import Ranking
from services.core.registry import PLACEMENT, SCHEDULING
from services.core.round import place_step, rank_step
from services.core.snapshot import BaseMismatchError, SnapshotReplica
from services.core.state import ClusterState
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.scheduler.topology import Topology
from tests.integration.test_scheduler import cluster, wait_for
from tests.unit.conformance.test_policies import OPTIONS

PlanForm = tuple[dict[str, list[tuple[str, list[int]]]], frozenset[str], dict[str, str]]


@dataclass
class Observer:
    """Rebuilds every round's snapshot from the bus and runs the round's two halves on it."""

    scheduling: str
    placement: str
    replica: SnapshotReplica = field(default_factory=SnapshotReplica)
    expected: dict[int, PlanForm] = field(default_factory=dict)
    rankings: list[tuple[int, list[str], list[str]]] = field(default_factory=list)
    """(round, the ranking the snapshot gives, the ranking the scheduler published)."""
    plans: list[PlacementPlan] = field(default_factory=list)
    cluster: ClusterState | None = None
    """The cluster of the last snapshot rebuilt."""

    def __post_init__(self) -> None:
        self.rank_policy = SCHEDULING.create(self.scheduling, **OPTIONS.get(("scheduling", self.scheduling), {}))
        self.place_policy = PLACEMENT.create(self.placement, **OPTIONS.get(("placement", self.placement), {}))

    async def on_round(self, message: ScheduleRound) -> None:
        assert message.snapshot is not None
        try:
            jobs, cluster_state = self.replica.apply(message.snapshot)
        except BaseMismatchError:
            return  # the instance answers resync too; the full round follows
        self.cluster = cluster_state
        ranked = rank_step(self.rank_policy, jobs, cluster_state, message.snapshot.now, fill_only=message.fill_only)
        if any(job_id not in jobs for job_id in message.ranked):
            return  # refused by placement as well; nothing is placed
        ranking = Ranking(order=tuple(message.ranked), terminate=dict(message.terminate),
                          gpu_targets=dict(message.gpu_targets), preempt=message.preempt)  # fmt: skip
        plan = place_step(self.place_policy, ranking, jobs, cluster_state, message.snapshot.now,
                          fill_only=message.fill_only)  # fmt: skip
        launch = {job_id: _by_node(cluster_state, gpus) for job_id, gpus in plan.launch.items() if gpus}
        self.rankings.append((message.round, list(ranked.order), list(message.ranked)))
        self.expected[message.round] = (launch, frozenset(plan.suspend), dict(plan.terminate))

    async def on_plan(self, plan: PlacementPlan) -> None:
        if not plan.resync and plan.error is None:
            self.plans.append(plan)


def _by_node(cluster_state: ClusterState, gpus: tuple[int, ...]) -> list[tuple[str, list[int]]]:
    by_node: dict[str, list[int]] = {}
    for g in sorted(gpus):
        by_node.setdefault(cluster_state.gpus[g].node_id, []).append(cluster_state.gpus[g].local_index)
    return list(by_node.items())


def _form(plan: PlacementPlan) -> PlanForm:
    launch = {job_id: [(p.node_id, list(p.gpus)) for p in parts] for job_id, parts in plan.launch.items()}
    return launch, frozenset(plan.suspend), dict(plan.terminate)


def spec(name: str, gpus: int, te: bool = False) -> JobSpec:
    return JobSpec(name=name, command=["python", "train.py"], gpus=gpus, grace_period_s=5.0,
                   job_class=JobClass.TE if te else JobClass.BE, expected_duration_s=60.0 * gpus)  # fmt: skip


CASES = [pytest.param("las", name, id=f"las+{name}") for name in PLACEMENT.names()] + [
    pytest.param(name, "consolidated", id=f"{name}+consolidated")
    for name in ("fifo", "tiresias", "srtf", "fitgpp", "pollux")
]

LINKS: dict[str, tuple[list[list[float]], float | None]] = {
    "n0": ([[0.0, 200.0, 200.0, 400.0], [200.0, 0.0, 400.0, 200.0], [200.0, 400.0, 0.0, 200.0],
            [400.0, 200.0, 200.0, 0.0]], 10.0),
    "n1": ([[0.0, 96.0, 96.0, 96.0], [96.0, 0.0, 96.0, 96.0], [96.0, 96.0, 0.0, 96.0], [96.0, 96.0, 96.0, 0.0]], None),
}  # fmt: skip
"""Link facts two of the three nodes register (a p3.8xlarge's NVLink pairs and a 10 Gb/s uplink; PCIe),
so that the placement replicas rebuild them and the bandwidth-aware policy places by them."""


@pytest.mark.parametrize(("scheduling", "placement"), CASES)
async def test_live_rounds_equal_the_simulated_round_on_the_same_snapshot(
    broker: Broker, namespace: str, tmp_path: Path, scheduling: str, placement: str
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 4, "n1": 4, "n2": 2}, links=LINKS)
        s = await c.start_scheduler(policy=scheduling, policy_options=OPTIONS.get(("scheduling", scheduling), {}),
                                    with_placement=False, round_s=0.2)  # fmt: skip
        service = PlacementService(PlacementConfig(
            nats=broker.url, namespace=namespace, policy=placement,
            policy_options=OPTIONS.get(("placement", placement), {}),
        ))  # fmt: skip
        await service.start(await c.connect("placement"))
        observer = Observer(scheduling, placement)
        await c.client.subscribe(SCHEDULE_ROUND, ScheduleRound, observer.on_round)
        await c.client.subscribe(PLACEMENT_PLAN, PlacementPlan, observer.on_plan)
        await wait_for(lambda: s.is_leader and len(s.inventory) == 3, what="leader with 3 nodes")
        try:
            sizes = [1, 2, 4, 1, 2, 1, 4, 2]
            for i, gpus in enumerate(sizes):
                await c.submit(f"a{i}", spec(f"a{i}", gpus))
            await wait_for(lambda: len(workers.log) >= 3, what="first grants")
            # Churn: completions free GPUs, later arrivals (TE among them) compete for them.
            for round_ in range(3):
                running = [(node, lease) for node, fake in workers.nodes.items() for lease in list(fake.leases)]
                for node, lease in running[:2]:
                    # A preemption may have suspended it while the previous finish was published.
                    if lease in workers.nodes[node].leases:
                        await workers.finish(node, lease, completed=True)
                for i in range(3):
                    await c.submit(f"b{round_}-{i}", spec(f"b{round_}-{i}", 1 + i % 2, te=i == 0))
                before = len(observer.plans)
                await wait_for(lambda: len(observer.plans) >= before + 2, what="two more plans")  # noqa: B023
        finally:
            await service.stop()
        await asyncio.sleep(0)  # let the last plan's callback finish
    # The replica rebuilt the nodes' link facts as the scheduler's topology holds them.
    assert observer.cluster is not None
    expected_nodes = Topology(s.inventory.live()).cluster().nodes
    for node_id, node in observer.cluster.nodes.items():
        assert (node.link_bandwidth_gbps, node.network_gbps) == (
            expected_nodes[node_id].link_bandwidth_gbps, expected_nodes[node_id].network_gbps
        ), node_id  # fmt: skip
    assert observer.cluster.nodes["n0"].link_bandwidth_gbps[(3, 0)] == 400.0
    compared = 0
    for plan in observer.plans:
        expected = observer.expected.get(plan.round)
        assert expected is not None, f"round {plan.round} placed by the service but not rebuilt by the observer"
        assert _form(plan) == expected, f"round {plan.round}: the live plan differs from the simulated round"
        compared += 1
    assert compared >= 6
    # And the ranking the scheduler published is the one the snapshot alone gives.
    for number, from_snapshot, published in observer.rankings:
        assert from_snapshot == published, f"round {number}: ranking the snapshot gives another order"
    assert any(plan.launch for plan in observer.plans)
