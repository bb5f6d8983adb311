"""Priority tiers (issue 14, item 5): ``spec.priority`` ranks before the policy's order in the shared
round step (``services.core.round.by_priority``), so the scheduler and the simulator do the same;
a higher tier preempts a lower one under a preemptive policy, never the other way round."""

from __future__ import annotations

import dataclasses

import pytest

from services.core import ADMISSION, PLACEMENT, SCHEDULING, run_round
from services.core.decisions import Ranking
from services.core.round import by_priority, rank_step
from services.core.state import JobState
from tests.unit.policies.builders import cluster, job, jobs_of


def tier(state: JobState, priority: int) -> JobState:
    return dataclasses.replace(state, spec=state.spec.model_copy(update={"priority": priority}))


@pytest.mark.parametrize(
    ("priorities", "policy_order", "ranked"),
    [
        ({"a": 0, "b": 0, "c": 0}, ("c", "a", "b"), ("c", "a", "b")),
        ({"a": 0, "b": 5, "c": 0}, ("c", "a", "b"), ("b", "c", "a")),
        ({"a": -1, "b": 0, "c": 0}, ("a", "b", "c"), ("b", "c", "a")),
        ({"a": 2, "b": 1, "c": 2}, ("c", "b", "a"), ("c", "a", "b")),
    ],
    ids=["one-tier-keeps-the-policy-order", "higher-tier-first", "negative-tier-last", "policy-order-within-a-tier"],
)
def test_tiers_rank_before_the_policys_order(
    priorities: dict[str, int], policy_order: tuple[str, ...], ranked: tuple[str, ...]
) -> None:
    jobs = jobs_of(*(tier(job(j), p) for j, p in priorities.items()))
    ranking = Ranking(order=policy_order, terminate={"a": "converged"}, gpu_targets={"b": 2}, preempt=False)
    tiered = by_priority(ranking, jobs)
    assert tuple(tiered.order) == ranked
    assert (dict(tiered.terminate), dict(tiered.gpu_targets), tiered.preempt) == ({"a": "converged"}, {"b": 2}, False)


def test_one_tier_returns_the_policys_ranking_itself() -> None:
    jobs = jobs_of(job("a"), job("b"))
    ranking = Ranking(order=("b", "a"), running=(), waiting=("b", "a"))
    assert by_priority(ranking, jobs) is ranking  # hints and all: no cost without priorities


def round_with(priority: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """srtf on one GPU: a short job runs; a long one arrives at ``priority`` (the short one's is 0).
    Returns the plan's (launched, suspended) job ids."""
    short = job("short", on=(0,), duration=100.0, executed=50.0, started=0.0)
    long = tier(job("long", duration=10_000.0, submit=40.0, seq=1), priority)
    jobs = jobs_of(short, long)
    result = run_round(
        admission=ADMISSION.create("accept-all"), scheduling=SCHEDULING.create("srtf"),
        placement=PLACEMENT.create("consolidated"), offered=[], jobs=jobs, cluster=cluster(1, 1, running=[short]),
        now=50.0,
    )  # fmt: skip
    return tuple(result.plan.launch), tuple(result.plan.suspend)


@pytest.mark.parametrize(
    ("priority", "launched", "suspended"),
    [(0, (), ()), (-5, (), ()), (5, ("long",), ("short",))],
    ids=["same-tier-srtf-decides", "lower-tier-waits", "higher-tier-preempts"],
)
def test_a_higher_tier_preempts_a_lower_one(
    priority: int, launched: tuple[str, ...], suspended: tuple[str, ...]
) -> None:
    assert round_with(priority) == (launched, suspended)


def test_a_non_preemptive_policy_only_lets_the_higher_tier_take_free_gpus_first() -> None:
    running = job("running", on=(0,), submit=0.0)
    first, urgent = job("first", submit=1.0, seq=1), tier(job("urgent", submit=2.0, seq=2), 3)
    jobs = jobs_of(running, first, urgent)
    ranking = rank_step(SCHEDULING.create("fifo"), jobs, cluster(1, 2, running=[running]), 10.0)
    assert tuple(ranking.order) == ("urgent", "running", "first")
    assert not ranking.preempt
    result = run_round(
        admission=ADMISSION.create("accept-all"), scheduling=SCHEDULING.create("fifo"),
        placement=PLACEMENT.create("consolidated"), offered=[], jobs=jobs, cluster=cluster(1, 2, running=[running]),
        now=10.0,
    )  # fmt: skip
    assert dict(result.plan.launch) == {"urgent": (1,)}
    assert result.plan.suspend == ()
