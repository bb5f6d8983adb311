"""Optimus: remaining-time order, then leftover GPUs to elastic jobs by marginal gain."""

from __future__ import annotations

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.optimus import OptimusPolicy
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

# With serial_fraction s = 0 the gain of GPU w+1 for a job needing R s on g GPUs is R*g*(1/w - 1/(w+1)).
CASES: list[tuple[str, dict[str, float], int, list[JobState], list[str], dict[str, int]]] = [
    (
        # Order c(50) a(100) b(300); bases 2+1+1 leave 4 GPUs. Gains: b 150, then a 50 / b 50,
        # then b 25 (a's next is 16.7): b reaches its cap of 4, a gets 2.
        "leftover GPUs go to the largest marginal gains",
        {"serial_fraction": 0.0},
        8,
        [
            job("a", gpus=1, max_gpus=4, duration=100.0),
            job("b", gpus=1, max_gpus=4, duration=300.0),
            job("c", gpus=2, duration=50.0),
        ],
        ["c", "a", "b"],
        {"a": 2, "b": 4},
    ),
    (
        # s = 0.1: a's 2nd GPU saves 100*0.9*(1 - 1/2) = 45 s, its 3rd 100*0.9*(1/2 - 1/3) = 15 s < 20.
        "extra GPUs stop when the gain drops to min_gain_s",
        {"serial_fraction": 0.1, "min_gain_s": 20.0},
        4,
        [job("a", gpus=1, max_gpus=3, duration=100.0), job("b", gpus=1, duration=200.0)],
        ["a", "b"],
        {"a": 2},
    ),
    (
        "a job that does not fit gets nothing, and no GPU is left for extras",
        {},
        4,
        [job("big", gpus=4, duration=10.0), job("elastic", gpus=1, max_gpus=8, duration=20.0)],
        ["big", "elastic"],
        {},
    ),
    (
        "a job that does not fit is skipped; a later one may still take its base",
        {"serial_fraction": 0.0},
        4,
        [
            job("first", gpus=3, duration=10.0),
            job("too-big", gpus=2, duration=20.0),
            job("elastic", gpus=1, max_gpus=2, duration=30.0),
        ],
        ["first", "too-big", "elastic"],
        {},
    ),
    (
        "jobs without an estimate rank last and get no extras",
        {"serial_fraction": 0.0},
        4,
        [job("unknown", gpus=1, max_gpus=4, submit=0.0), job("known", gpus=1, max_gpus=2, duration=10.0)],
        ["known", "unknown"],
        {"known": 2},
    ),
    (
        # "grown" ran 50 iterations left at 1 s on 4 GPUs: 50 s there, 100 s on its requested 2 (s=0).
        "measured remaining time is converted back to the requested GPU count",
        {"serial_fraction": 0.0},
        8,
        [
            job(
                "grown",
                gpus=2,
                max_gpus=4,
                on=(0, 1, 2, 3),
                iterations=100,
                iterations_done=50,
                iteration_time=1.0,
            ),
            job("other", gpus=2, duration=80.0),
        ],
        ["other", "grown"],
        {"grown": 4},
    ),
]


@pytest.mark.parametrize(
    ("options", "gpus", "items", "order", "targets"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_ranking(
    options: dict[str, float], gpus: int, items: list[JobState], order: list[str], targets: dict[str, int]
) -> None:
    policy = SCHEDULING.create("optimus", **options)
    jobs = jobs_of(*items)
    state = cluster(1, gpus, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)

    ranking = policy.rank(jobs, state, 0.0)

    assert list(ranking.order) == order
    assert dict(ranking.gpu_targets) == targets
    assert_unchanged(before, jobs, state)


def test_marginal_gain_is_amdahl() -> None:
    policy = OptimusPolicy(serial_fraction=0.2)
    # R = 100 s on g = 2 GPUs: on w GPUs 100 * (0.2 + 0.8 * 2 / w); 2 -> 3 saves 100*0.8*2*(1/2-1/3).
    assert policy.marginal_gain(100.0, 2, 2) == pytest.approx(100 * 0.8 * 2 * (1 / 2 - 1 / 3))
    assert policy.time_factor(2, 2) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "options", [{"serial_fraction": 1.0}, {"serial_fraction": -0.1}, {"min_gain_s": -1.0}],
    ids=["s=1", "s<0", "negative min gain"],
)
def test_rejects_bad_options(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        OptimusPolicy(**options)  # type: ignore[arg-type]


def test_a_starved_job_goes_first_as_in_blox() -> None:
    # "long" (1000 s left) has waited 100 s since its suspension; "short" (10 s left) just arrived.
    long = job("long", duration=2000.0, executed=1000.0, queued_since=0.0, preempted=0.0, submit=0.0)
    short = job("short", duration=10.0, submit=90.0, queued_since=90.0)
    jobs = jobs_of(long, short)
    state = cluster(1, 1)
    assert list(OptimusPolicy(starvation_s=100.0).rank(jobs, state, 99.0).order) == ["short", "long"]
    assert list(OptimusPolicy(starvation_s=100.0).rank(jobs, state, 100.0).order) == ["long", "short"]
    assert list(OptimusPolicy(starvation_s=None).rank(jobs, state, 1e9).order) == ["short", "long"]
    assert OptimusPolicy().starvation_s == 3_600_000.0  # Blox's 1000 h
    with pytest.raises(ValueError, match="starvation_s"):
        OptimusPolicy(starvation_s=0.0)
