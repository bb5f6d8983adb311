"""FIFO: submit order, never preempts, and its sort key agrees with rank()."""

from __future__ import annotations

import math

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

CASES: list[tuple[str, list[JobState], list[str]]] = [
    ("submit order", [job("b", submit=2.0), job("a", submit=1.0), job("c", submit=3.0)], ["a", "b", "c"]),
    (
        "running jobs keep their place by submit time",
        [job("new", submit=9.0), job("old", submit=1.0, on=(0,), service=500.0)],
        ["old", "new"],
    ),
    (
        "equal submit times fall back to seq",
        [job("y", submit=1.0, seq=2), job("x", submit=1.0, seq=1)],
        ["x", "y"],
    ),
    (
        "a suspended job goes back to the top (FitGpp 2.1)",
        [job("later", submit=5.0), job("suspended", submit=1.0, service=100.0, preempted=4.0)],
        ["suspended", "later"],
    ),
]


@pytest.mark.parametrize(("items", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_ranking(items: list[JobState], expected: list[str]) -> None:
    policy = SCHEDULING.create("fifo")
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)
    ranking = policy.rank(jobs, state, now=10.0)
    assert list(ranking.order) == expected
    assert ranking.preempt is False
    assert not ranking.terminate
    assert_unchanged(before, jobs, state)


def test_sort_key_matches_rank_and_never_expires() -> None:
    policy = SCHEDULING.create("fifo")
    items = [job(f"j{i}", submit=float(7 * i % 5), seq=i) for i in range(6)]
    jobs = jobs_of(*items)
    by_key = sorted(items, key=lambda j: policy.sort_key(j, 3.0))  # type: ignore[attr-defined]
    assert [j.job_id for j in by_key] == list(policy.rank(jobs, cluster(), 3.0).order)
    assert all(policy.key_stable_until(j, 3.0) == math.inf for j in items)  # type: ignore[attr-defined]
    assert policy.preemptive is False  # type: ignore[attr-defined]
