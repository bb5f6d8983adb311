"""ClusterState's free-GPU index, one pure round, and the placement walk's edge cases."""

from __future__ import annotations

import pytest

from services.core import ADMISSION, PLACEMENT, SCHEDULING, run_round
from services.core.decisions import Placement, Ranking
from services.core.placing import place_in_order
from services.core.round import diff_plan
from services.core.state import ClusterState
from services.placement.policies.first_free import first_free_fit
from tests.unit.policies.builders import cluster, job, jobs_of


def test_free_index_follows_assign_and_release() -> None:
    state = ClusterState.uniform(2, 4)
    assert state.free_by_node() == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
    state.assign("a", (0, 1, 2, 3))
    state.assign("b", (5,))
    assert state.free_by_node() == {1: {4, 6, 7}}
    assert state.free_gpu_count == 3
    assert state.free_on_node("node-1") == [4, 6, 7]
    assert state.nodes_spanned((3, 4)) == 2
    state.release("a", (0, 1))
    assert state.free_by_node() == {0: {0, 1}, 1: {4, 6, 7}}
    with pytest.raises(ValueError, match="does not hold"):
        state.release("b", (0,))
    with pytest.raises(ValueError, match="already holds"):
        state.assign("b", (5,))
    scratch = state.free_by_node()
    scratch[0].clear()
    assert state.free_gpu_count == 5  # callers get a copy
    assert state.largest_node_gpus == 4


def test_one_round_admits_ranks_places_and_diffs() -> None:
    running = job("old", submit=0.0, on=(0,))
    jobs = jobs_of(running)
    state = cluster(1, 2, running=[running])
    offered = [job("new1", submit=5.0, seq=1), job("new2", submit=6.0, seq=2)]
    result = run_round(
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"),
        placement=PLACEMENT.create("consolidated"),
        offered=offered,
        jobs=jobs,
        cluster=state,
        now=10.0,
    )
    assert result.admission.accepted == ("new1", "new2")
    assert list(result.ranking.order) == ["old", "new1", "new2"]
    assert dict(result.plan.launch) == {"new1": (1,)}
    assert result.plan.suspend == ()
    assert dict(result.placement.allocation) == {"old": (0,), "new1": (1,)}


def test_diff_plan_without_a_hint_walks_the_allocation() -> None:
    a, b = job("a", on=(0,)), job("b")
    jobs = jobs_of(a, b)
    plan = diff_plan(Placement(allocation={"b": (0,)}), Ranking(order=("b", "a")), jobs)
    assert plan.suspend == ("a",)
    assert dict(plan.launch) == {"b": (0,)}


def test_terminate_frees_gpus_and_is_never_launched() -> None:
    done, waiting = job("done", on=(0,)), job("w")
    jobs = jobs_of(done, waiting)
    state = cluster(1, 1, running=[done])
    ranking = Ranking(order=("done", "w"), terminate={"done": "converged"})
    placement = place_in_order(ranking, jobs, state, first_free_fit)
    plan = diff_plan(placement, ranking, jobs)
    assert dict(plan.launch) == {"w": (0,)}
    assert dict(plan.terminate) == {"done": "converged"}
    assert "done" not in placement.allocation


def test_elastic_targets_resize_running_jobs() -> None:
    grow, other = job("grow", gpus=1, max_gpus=4, on=(0,)), job("other", on=(3,))
    jobs = jobs_of(grow, other)
    state = cluster(1, 4, running=[grow, other])
    ranking = Ranking(order=("grow", "other"), gpu_targets={"grow": 3})
    placement = place_in_order(ranking, jobs, state, first_free_fit)
    assert placement.plan is not None
    assert placement.plan.suspend == ("grow",)
    assert dict(placement.plan.launch) == {"grow": (0, 1, 2)}
    assert placement.allocation["other"] == (3,)
