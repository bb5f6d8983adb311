"""LAS: least attained service (GPU-seconds) first, Blox's starvation promotion, fast-path hooks."""

from __future__ import annotations

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.las import BLOX_STARVATION_S, Las
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

CASES: list[tuple[str, dict[str, object], list[JobState], list[str]]] = [
    (
        "least service first, running or not",
        {},
        [job("long", service=900.0, on=(0,)), job("new", submit=5.0), job("mid", service=300.0)],
        ["new", "mid", "long"],
    ),
    (
        "service counts GPU-seconds: 2 GPUs for 100 s beat 1 GPU for 150 s",
        {},
        [job("wide", gpus=2, service=200.0, on=(0, 1)), job("narrow", service=150.0, on=(2,))],
        ["narrow", "wide"],
    ),
    (
        "ties in service break by submit time, then seq",
        {},
        [job("b", submit=2.0, seq=2), job("a2", submit=1.0, seq=3), job("a1", submit=1.0, seq=1)],
        ["a1", "a2", "b"],
    ),
    (
        "a job that waited starvation_s is promoted ahead of everyone",
        {"starvation_s": 100.0},
        [job("fresh", submit=190.0), job("starved", service=5000.0, queued_since=50.0)],
        ["starved", "fresh"],
    ),
    (
        "just short of the threshold: still by service",
        {"starvation_s": 100.0},
        [job("fresh", submit=190.0), job("waiting", service=5000.0, queued_since=101.0)],
        ["fresh", "waiting"],
    ),
    (
        "pure LAS with starvation_s=None",
        {"starvation_s": None},
        [job("fresh", submit=190.0), job("starved", service=5000.0, queued_since=0.0)],
        ["fresh", "starved"],
    ),
]


@pytest.mark.parametrize(
    ("options", "items", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_ranking(options: dict[str, object], items: list[JobState], expected: list[str]) -> None:
    policy = SCHEDULING.create("las", **options)
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)
    ranking = policy.rank(jobs, state, now=200.0)
    assert list(ranking.order) == expected
    assert ranking.preempt is True
    assert_unchanged(before, jobs, state)


def test_promotion_is_sticky_once_earned() -> None:
    policy = Las(starvation_s=100.0)
    ran_after_starving = job("s", service=10_000.0, on=(0,))
    ran_after_starving.longest_wait_s = 150.0
    assert policy.promoted(ran_after_starving, now=1e6)
    assert policy.sort_key(ran_after_starving, 1e6)[0] == 0


def test_key_stable_until_announces_the_promotion() -> None:
    policy = Las(starvation_s=100.0)
    waiting = job("w", service=50.0, queued_since=30.0)
    assert policy.key_stable_until(waiting, now=40.0) == 130.0
    assert policy.sort_key(waiting, 129.0)[0] == 1
    assert policy.sort_key(waiting, 130.0)[0] == 0
    assert policy.key_stable_until(waiting, now=130.0) == float("inf")


def test_key_parts_split_the_key_around_service() -> None:
    policy = Las()
    running = job("r", service=42.0, submit=3.0, seq=7, on=(0,))
    head, tail = policy.key_parts(running)
    assert (*head, running.attained_service, *tail) == policy.sort_key(running, now=99.0)


def test_default_threshold_is_bloxs() -> None:
    assert Las().starvation_s == BLOX_STARVATION_S == 3_600_000.0


def test_rejects_nonpositive_threshold() -> None:
    with pytest.raises(ValueError, match="starvation_s"):
        Las(starvation_s=0.0)


def test_las_time_ranks_by_executed_time_not_gpu_seconds() -> None:
    # Blox's attained service is executed wall time: 2 GPUs for 100 s (200 GPU-s) now rank ahead of
    # 1 GPU for 150 s, the reverse of ``las`` (GPU-seconds); one-GPU jobs rank alike under both.
    wide = job("wide", gpus=2, service=200.0, executed=100.0, on=(0, 1))
    narrow = job("narrow", service=150.0, executed=150.0, on=(2,))
    fresh = job("fresh", submit=5.0)
    jobs = jobs_of(wide, narrow, fresh)
    state = cluster(1, 4, running=[wide, narrow])
    before = frozen(jobs, state)
    assert list(SCHEDULING.create("las-time").rank(jobs, state, now=200.0).order) == ["fresh", "wide", "narrow"]
    assert list(SCHEDULING.create("las").rank(jobs, state, now=200.0).order) == ["fresh", "narrow", "wide"]
    assert_unchanged(before, jobs, state)


def test_las_time_keeps_the_starvation_promotion_and_has_no_key_parts() -> None:
    policy = SCHEDULING.create("las-time", starvation_s=100.0)
    starved = job("starved", service=5000.0, executed=5000.0, queued_since=50.0)
    fresh = job("fresh", submit=190.0)
    jobs = jobs_of(fresh, starved)
    assert list(policy.rank(jobs, cluster(1, 4), now=200.0).order) == ["starved", "fresh"]
    assert getattr(policy, "key_parts", None) is None  # executed time does not grow with the GPU count
