"""KeyedOrder gives exactly sorted(jobs, key=sort_key), through every lazy view, as jobs change."""

from __future__ import annotations

import random

import pytest

from services.core.decisions import Ranking
from services.core.ordering import SORTED_LIMIT, KeyedOrder
from services.core.placing import Fit, SingleNode, place_in_order
from services.core.state import ClusterState, JobState, JobStatus
from services.placement.policies.consolidated import consolidated_fit, consolidated_single_node
from services.placement.policies.first_free import first_free_fit, first_free_single_node
from services.scheduler.policies.fifo import Fifo
from services.scheduler.policies.las import Las
from tests.unit.policies.builders import job

NOW = 1000.0


def _line(job_: JobState) -> tuple[float, float]:
    # In these tests time stands still at NOW and every running job is productive.
    return job_.attained_service - len(job_.gpus) * NOW, NOW - 1.0


def _scenario(
    seed: int, nodes: int = 4, per_node: int = 4, *, one_gpu: bool = False
) -> tuple[dict[str, JobState], ClusterState]:
    rng = random.Random(seed)
    cluster = ClusterState.uniform(nodes, per_node)
    jobs: dict[str, JobState] = {}
    free = list(range(nodes * per_node))
    for i in range(rng.randint(3, 30)):
        gpus = 1 if one_gpu else rng.choice((1, 1, 2, 4))
        service = float(rng.choice((0, 100, 100, 300, 1200)))
        state = job(f"j{i}", gpus=gpus, submit=float(rng.randint(0, 5)), seq=i, service=service)
        if rng.random() < 0.5 and len(free) >= gpus:
            state.gpus = tuple(free[:gpus])
            del free[:gpus]
            state.status = JobStatus.RUNNING
            cluster.assign(state.job_id, state.gpus)
        else:
            state.queued_since = float(rng.randint(0, 900))
        jobs[state.job_id] = state
    return jobs, cluster


def _keyed(policy: Fifo | Las, jobs: dict[str, JobState], grouped: bool) -> KeyedOrder:
    order = KeyedOrder(policy, service_line=_line if grouped else None)
    for state in jobs.values():
        if state.is_running:
            order.mark_running(state)
        else:
            order.push(state, NOW)
    return order


POLICIES = [Fifo(), Las(), Las(starvation_s=500.0)]
consolidated = (consolidated_fit, consolidated_single_node)
first_free = (first_free_fit, first_free_single_node)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "resorted"])
@pytest.mark.parametrize("policy", POLICIES, ids=["fifo", "las", "las-starvation"])
@pytest.mark.parametrize("seed", range(25))
def test_views_equal_rank(policy: Fifo | Las, grouped: bool, seed: int) -> None:
    jobs, cluster = _scenario(seed)
    expected = list(policy.rank(jobs, cluster, NOW).order)
    ranking = _keyed(policy, jobs, grouped).ranking(jobs, NOW)
    assert list(ranking.order) == expected
    assert ranking.running is not None
    assert ranking.waiting is not None
    assert ranking.key is not None
    assert list(ranking.running) == [j for j in expected if jobs[j].is_running]
    assert list(reversed(ranking.running)) == [j for j in reversed(expected) if jobs[j].is_running]
    assert list(ranking.waiting) == [j for j in expected if not jobs[j].is_running]
    assert sorted(expected, key=ranking.key) == expected
    assert len(ranking.order) == len(jobs)
    assert ranking.order[0] == expected[0]


@pytest.mark.parametrize("one_gpu", [True, False], ids=["one-gpu", "mixed"])
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "resorted"])
@pytest.mark.parametrize("policy", POLICIES, ids=["fifo", "las", "las-starvation"])
@pytest.mark.parametrize("seed", range(15))
def test_keyed_views_hand_out_the_sort_keys(policy: Fifo | Las, grouped: bool, one_gpu: bool, seed: int) -> None:
    jobs, cluster = _scenario(seed, one_gpu=one_gpu)
    expected = list(policy.rank(jobs, cluster, NOW).order)
    ranking = _keyed(policy, jobs, grouped).ranking(jobs, NOW)
    waiting = ranking.waiting
    running = ranking.running
    assert waiting is not None
    assert running is not None
    items = list(waiting.keyed_items())  # type: ignore[attr-defined]
    assert [j for _, j in items] == [j for j in expected if not jobs[j].is_running]
    assert [k for k, _ in items] == [policy.sort_key(jobs[j], NOW) for _, j in items]
    lowest_first = list(running.keyed_reversed())  # type: ignore[attr-defined]
    assert [j for _, j in lowest_first] == [j for j in reversed(expected) if jobs[j].is_running]
    assert [k for k, _ in lowest_first] == [policy.sort_key(jobs[j], NOW) for _, j in lowest_first]


@pytest.mark.parametrize("fit", [consolidated_fit, first_free_fit], ids=["consolidated", "first-free"])
@pytest.mark.parametrize("policy", POLICIES, ids=["fifo", "las", "las-starvation"])
@pytest.mark.parametrize("seed", range(25))
def test_two_pointer_walk_equals_full_walk(policy: Fifo | Las, fit: object, seed: int) -> None:
    jobs, cluster = _scenario(seed, nodes=3)
    full = place_in_order(policy.rank(jobs, cluster, NOW), jobs, cluster, fit)  # type: ignore[arg-type]
    fast = place_in_order(_keyed(policy, jobs, True).ranking(jobs, NOW), jobs, cluster, fit)  # type: ignore[arg-type]
    assert full.plan is not None
    assert fast.plan is not None
    assert dict(fast.plan.launch) == dict(full.plan.launch)
    assert sorted(fast.plan.suspend) == sorted(full.plan.suspend)
    assert dict(fast.allocation) == dict(full.allocation)


@pytest.mark.parametrize("fit", [consolidated, first_free], ids=["consolidated", "first-free"])
@pytest.mark.parametrize("policy", POLICIES, ids=["fifo", "las", "las-starvation"])
@pytest.mark.parametrize("seed", range(25))
def test_one_gpu_swaps_equal_full_walk(policy: Fifo | Las, fit: tuple[Fit, SingleNode], seed: int) -> None:
    """One-GPU jobs on a full cluster: the two-pointer walk's direct swap (a waiting job takes the
    lowest victim's GPU) gives the plan of the full walk, victim by victim."""
    jobs, cluster = _scenario(seed, nodes=2, per_node=4, one_gpu=True)
    fit_rule, single_node = fit
    full = place_in_order(policy.rank(jobs, cluster, NOW), jobs, cluster, fit_rule, single_node=single_node)
    fast = place_in_order(
        _keyed(policy, jobs, True).ranking(jobs, NOW), jobs, cluster, fit_rule, single_node=single_node
    )
    assert full.plan is not None
    assert fast.plan is not None
    assert dict(fast.plan.launch) == dict(full.plan.launch)
    assert list(fast.plan.suspend) == list(full.plan.suspend)
    assert dict(fast.allocation) == dict(full.allocation)


def test_changes_are_tracked() -> None:
    policy = Las()
    a, b, c = job("a", service=10.0, seq=1), job("b", service=20.0, seq=2), job("c", service=5.0, seq=3)
    jobs = {j.job_id: j for j in (a, b, c)}
    order = KeyedOrder(policy, service_line=_line)
    for j in (a, b, c):
        order.push(j, NOW)
    assert list(order.ranking(jobs, NOW).order) == ["c", "a", "b"]
    c.status, c.gpus, c.attained_service = JobStatus.RUNNING, (0,), 50.0
    order.mark_running(c)
    assert list(order.ranking(jobs, NOW).order) == ["a", "b", "c"]
    assert order.running_count == 1
    assert order.waiting_count == 2
    order.discard("a")
    del jobs["a"]
    assert list(order.ranking(jobs, NOW).order) == ["b", "c"]
    c.status, c.gpus = JobStatus.QUEUED, ()
    order.push(c, NOW)
    assert list(order.ranking(jobs, NOW).order) == ["b", "c"]
    assert order.running_count == 0


def test_expiring_keys_are_refreshed() -> None:
    policy = Las(starvation_s=100.0)
    old = job("old", service=900.0, queued_since=0.0, seq=1)
    new = job("new", service=0.0, queued_since=50.0, seq=2)
    jobs = {"old": old, "new": new}
    order = KeyedOrder(policy)
    order.push(old, 50.0)
    order.push(new, 50.0)
    assert list(order.ranking(jobs, 60.0).order) == ["new", "old"]
    assert list(order.ranking(jobs, 100.0).order) == ["old", "new"]


def test_expiries_out_of_time_order_are_refreshed() -> None:
    # Expiries usually come in time order (a queue); one that does not (``early``, pushed after
    # ``late`` with an earlier expiry) takes the other path, and every promotion still happens on time.
    policy = Las(starvation_s=100.0)
    late = job("late", service=900.0, queued_since=40.0, seq=1)
    early = job("early", service=800.0, queued_since=0.0, seq=2)
    new = job("new", service=0.0, queued_since=50.0, seq=3)
    jobs = {j.job_id: j for j in (late, early, new)}
    order = KeyedOrder(policy)
    for j in (late, early, new):
        order.push(j, 50.0)
    seen = {}
    for now in (60.0, 100.0, 140.0, 150.0):
        expected = [j.job_id for j in sorted(jobs.values(), key=lambda j: policy.sort_key(j, now))]
        seen[now] = list(order.ranking(jobs, now).order)
        assert seen[now] == expected
    assert seen[60.0] == ["new", "early", "late"]
    assert seen[100.0] == ["early", "new", "late"]
    assert seen[140.0] == ["early", "late", "new"]
    assert seen[150.0] == ["new", "early", "late"]


def test_long_queues_switch_to_a_heap_and_back() -> None:
    # Up to SORTED_LIMIT entries the waiting jobs are a sorted list, beyond it a heap, and a sorted
    # list again once the queue has shrunk: the order is sorted(jobs, key=sort_key) in both modes,
    # through starts (which leave stale entries at the front) and departures.
    policy = Las()
    rng = random.Random(11)
    order = KeyedOrder(policy)
    jobs: dict[str, JobState] = {}
    modes: set[bool] = set()

    def check() -> None:
        ranking = order.ranking(jobs, NOW)
        modes.add(order._sorted)
        expected = [j.job_id for j in sorted(jobs.values(), key=lambda j: policy.sort_key(j, NOW))]
        assert list(ranking.order) == expected
        assert list(ranking.waiting or ()) == [j for j in expected if not jobs[j].is_running]

    def start_first(count: int) -> None:
        for job_id in list(order.ranking(jobs, NOW).waiting or ())[:count]:
            state = jobs[job_id]
            state.status, state.gpus, state.queued_since = JobStatus.RUNNING, (0,), None
            order.mark_running(state)

    for i in range(SORTED_LIMIT + 300):
        state = job(f"j{i}", service=float(rng.randint(0, 10_000)), seq=i, queued_since=0.0)
        jobs[state.job_id] = state
        order.push(state, NOW)
        if i % 97 == 0:
            start_first(3)
            check()
    check()
    ids = list(jobs)
    rng.shuffle(ids)
    for n, job_id in enumerate(ids[:-100]):
        order.discard(job_id)
        del jobs[job_id]
        if n % 97 == 0:
            start_first(2)
            check()
    check()
    assert modes == {True, False}
    assert order._sorted


def test_ranking_is_a_plain_ranking() -> None:
    jobs, _ = _scenario(3)
    ranking = _keyed(Fifo(), jobs, False).ranking(jobs, NOW)
    assert isinstance(ranking, Ranking)
    assert ranking.preempt is False
    assert ranking.order == list(ranking.order)
