"""SRTF: shortest estimated remaining time first; jobs without an estimate last (or an error)."""

from __future__ import annotations

import math

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.estimates import MissingEstimateError, remaining_seconds
from services.scheduler.policies.srtf import SrtfPolicy
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

CASES: list[tuple[str, list[JobState], list[str]]] = [
    (
        "shortest remaining first, whatever ran so far",
        [
            job("a", duration=100.0, executed=80.0, on=(0,)),  # 20 s left
            job("b", duration=50.0),  # 50 s left
            job("c", iterations=1000, iterations_done=900, iteration_time=0.1),  # 10 s left
        ],
        ["c", "a", "b"],
    ),
    (
        "iterations x measured iteration time wins over the declared duration",
        [
            job("a", duration=10.0, iterations=100, iterations_done=50, iteration_time=1.0),  # 50 s
            job("b", duration=30.0),  # 30 s
        ],
        ["b", "a"],
    ),
    (
        "jobs without an estimate go last, in submit order",
        [job("x", submit=5.0), job("y", submit=1.0), job("z", duration=1000.0, submit=9.0)],
        ["z", "y", "x"],
    ),
    (
        "overrun jobs count as 0 s left",
        [job("over", duration=10.0, executed=50.0, on=(0,)), job("short", duration=1.0)],
        ["over", "short"],
    ),
    (
        "ties break by submit time, then seq",
        [
            job("late", duration=10.0, submit=2.0, seq=1),
            job("second", duration=10.0, submit=1.0, seq=3),
            job("first", duration=10.0, submit=1.0, seq=2),
        ],
        ["first", "second", "late"],
    ),
]


@pytest.mark.parametrize(("items", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_ranking(items: list[JobState], expected: list[str]) -> None:
    policy = SCHEDULING.create("srtf")
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)

    ranking = policy.rank(jobs, state, 100.0)

    assert list(ranking.order) == expected
    assert_unchanged(before, jobs, state)
    assert isinstance(policy, SrtfPolicy)
    assert [j.job_id for j in sorted(items, key=lambda j: policy.sort_key(j, 100.0))] == expected
    assert all(policy.key_stable_until(j, 100.0) == math.inf for j in items)


def test_missing_estimate_error_names_the_jobs() -> None:
    policy = SCHEDULING.create("srtf", on_missing="error")
    jobs = jobs_of(job("known", duration=5.0), job("mystery-1"), job("mystery-2"))
    with pytest.raises(MissingEstimateError, match=r"mystery-1, mystery-2.*expected_duration_s") as caught:
        policy.rank(jobs, cluster(1, 4), 0.0)
    assert caught.value.job_ids == ("mystery-1", "mystery-2")
    with pytest.raises(MissingEstimateError):
        SrtfPolicy(on_missing="error").sort_key(jobs["mystery-1"], 0.0)  # type: ignore[arg-type]


def test_rejects_unknown_missing_mode() -> None:
    with pytest.raises(ValueError, match="on_missing must be one of"):
        SrtfPolicy(on_missing="guess")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (job(duration=100.0, executed=30.0), 70.0),
        (job(iterations=10, iterations_done=4, iteration_time=2.5), 15.0),
        (job(iterations=10), None),  # no measured iteration time and no duration
        (job(iterations=10, duration=40.0, executed=10.0), 30.0),  # falls back to the duration
        (job(), None),
    ],
    ids=["duration", "iterations", "iterations unmeasured", "iterations fallback", "nothing"],
)
def test_remaining_seconds(item: JobState, expected: float | None) -> None:
    assert remaining_seconds(item) == expected


def test_a_starved_job_goes_first_as_in_blox() -> None:
    # "long" (1000 s left) has waited since its suspension at 0; "short" (10 s left) just arrived.
    long = job("long", duration=2000.0, executed=1000.0, queued_since=0.0, preempted=0.0, submit=0.0)
    short = job("short", duration=10.0, submit=90.0, queued_since=90.0)
    jobs = jobs_of(long, short)
    state = cluster(1, 1)
    policy = SrtfPolicy(starvation_s=100.0)
    assert list(policy.rank(jobs, state, 99.0).order) == ["short", "long"]
    assert list(policy.rank(jobs, state, 100.0).order) == ["long", "short"]
    # The fast path announces the promotion and its key agrees with rank().
    assert policy.key_stable_until(long, 50.0) == 100.0
    assert sorted(jobs, key=lambda j: policy.sort_key(jobs[j], 100.0)) == ["long", "short"]
    assert list(SrtfPolicy(starvation_s=None).rank(jobs, state, 1e9).order) == ["short", "long"]
    assert SrtfPolicy().starvation_s == 3_600_000.0  # Blox's 1000 h
    with pytest.raises(ValueError, match="starvation_s"):
        SrtfPolicy(starvation_s=-1.0)
