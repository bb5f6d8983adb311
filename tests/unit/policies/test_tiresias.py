"""Tiresias discretized 2D-LAS: queues by GPU-seconds, FIFO in a queue, starvation promotion."""

from __future__ import annotations

import math

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.tiresias import TiresiasPolicy
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

# Starved job used by several cases: 2 GPUs, ran 3600 s (7200 GPU-s: Q2), waiting since t=1000.
# Its starvation limit is knob 8 x 3600 s executed = 28800 s of waiting: due at t = 29800.
STARVED = dict(gpus=2, service=7200.0, executed=3600.0, queued_since=1000.0, preempted=1000.0, submit=0.0)
# The same job once its promotion started it at t = 29800 on GPUs 0-1.
PROMOTED = dict(gpus=2, on=(0, 1), preempted=1000.0, started=29800.0)

CASES: list[tuple[str, dict[str, object], list[JobState], float, list[str]]] = [
    (
        "new jobs are FIFO by submit time",
        {},
        [job("late", submit=10.0), job("early", submit=5.0)],
        20.0,
        ["early", "late"],
    ),
    (
        "reaching the threshold demotes (>=, GPU-seconds)",
        {},
        [
            job("old", gpus=4, submit=0.0, service=3600.0, executed=900.0, queued_since=100.0),
            job("young", submit=50.0, service=100.0, executed=100.0, queued_since=150.0),
        ],
        200.0,
        ["young", "old"],
    ),
    (
        "2D service: the wide job ages faster",
        {},
        [
            job("wide", gpus=4, on=(0, 1, 2, 3), service=4000.0, executed=1000.0, started=0.0),
            job("narrow", gpus=1, on=(4,), service=1000.0, executed=1000.0, started=0.0, submit=5.0),
        ],
        1000.0,
        ["narrow", "wide"],
    ),
    (
        "running jobs stay ahead of waiting ones in the same queue",
        {},
        [job("waiting", submit=0.0), job("running", submit=10.0, on=(0,), service=100.0, started=20.0)],
        120.0,
        ["running", "waiting"],
    ),
    (
        "a job demoted during its run goes behind the jobs waiting in its new queue",
        {},
        [
            job("demoted", submit=10.0, on=(0,), service=3700.0, executed=3700.0, started=5000.0),
            job("waiting", submit=0.0, service=4000.0, executed=4000.0, queued_since=4500.0, preempted=4500.0),
        ],
        5200.0,  # the run began at 3500 GPU-s, below the 3600 threshold
        ["waiting", "demoted"],
    ),
    (
        "a job that began its run in its queue stays ahead of the jobs waiting there",
        {},
        [
            job("settled", submit=10.0, on=(0,), service=3900.0, executed=3900.0, started=5000.0),
            job("waiting", submit=0.0, service=4000.0, executed=4000.0, queued_since=4500.0, preempted=4500.0),
        ],
        5200.0,  # the run began at 3700 GPU-s
        ["settled", "waiting"],
    ),
    (
        "a run that began exactly on the threshold ran in the lower queue",
        {},
        [
            job("settled", submit=10.0, on=(0, 1), gpus=2, service=4000.0, executed=2000.0, started=5000.0),
            job("waiting", submit=0.0, service=4000.0, executed=4000.0, queued_since=4500.0, preempted=4500.0),
        ],
        5200.0,  # 4000 - 2 GPUs x 200 s = 3600
        ["settled", "waiting"],
    ),
    (
        "a waiting job of a higher queue goes before a running job of a lower one",
        {},
        [job("long", on=(0,), service=5000.0, executed=5000.0, started=0.0), job("new", submit=4000.0)],
        5000.0,
        ["new", "long"],
    ),
    (
        "starved job is promoted to Q1 and queued by its promotion time",
        {},
        [
            job("starved", **STARVED),  # type: ignore[arg-type]
            job("before", submit=29000.0),
            job("after", submit=29900.0),
            job("q2", service=4000.0, executed=4000.0, queued_since=29000.0, preempted=29000.0),
        ],
        30000.0,
        ["before", "starved", "after", "q2"],
    ),
    (
        "not starved yet: one second before the limit",
        {},
        [job("starved", **STARVED), job("new", submit=29000.0)],  # type: ignore[arg-type]
        29799.0,
        ["new", "starved"],
    ),
    (
        "promote_knob=None disables promotion",
        {"promote_knob": None},
        [job("starved", **STARVED), job("before", submit=29000.0), job("after", submit=29900.0)],  # type: ignore[arg-type]
        1e9,
        ["before", "after", "starved"],
    ),
    (
        "promoted running job keeps Q1 while this run earned < threshold (1000 s x 2 GPUs)",
        {},
        [
            job("promoted", **PROMOTED, service=9200.0, executed=4600.0),  # type: ignore[arg-type]
            job("new", submit=30000.0),
        ],
        30800.0,
        ["promoted", "new"],
    ),
    (
        "promoted running job is demoted once this run earned the threshold (1800 s x 2 GPUs)",
        {},
        [
            job("promoted", **PROMOTED, service=10800.0, executed=5400.0),  # type: ignore[arg-type]
            job("new", submit=30000.0),
        ],
        31600.0,
        ["new", "promoted"],
    ),
    (
        "K=3 queues from two thresholds",
        {"queue_thresholds_gpu_s": (100.0, 1000.0)},
        [
            job("q3", submit=0.0, service=5000.0, executed=5000.0, queued_since=5000.0),
            job("q2", submit=1.0, service=500.0, executed=500.0, queued_since=5000.0),
            job("q1", submit=2.0, service=50.0, executed=50.0, queued_since=5000.0),
        ],
        5001.0,
        ["q1", "q2", "q3"],
    ),
    (
        "equal submit times break by seq",
        {},
        [job("b", submit=1.0, seq=2), job("a", submit=1.0, seq=1)],
        2.0,
        ["a", "b"],
    ),
]


@pytest.mark.parametrize(
    ("options", "items", "now", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_ranking(options: dict[str, object], items: list[JobState], now: float, expected: list[str]) -> None:
    policy = SCHEDULING.create("tiresias", **options)
    jobs = jobs_of(*items)
    state = cluster(2, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)

    ranking = policy.rank(jobs, state, now)

    assert list(ranking.order) == expected
    assert not ranking.terminate
    assert not ranking.gpu_targets
    assert_unchanged(before, jobs, state)
    # Fast-path contract: the ranking is exactly a sort by sort_key.
    assert isinstance(policy, TiresiasPolicy)
    assert [j.job_id for j in sorted(items, key=lambda j: policy.sort_key(j, now))] == expected


def test_key_stable_until_announces_the_promotion() -> None:
    policy = TiresiasPolicy()
    starved = job("starved", **STARVED)  # type: ignore[arg-type]
    assert policy.key_stable_until(starved, 2000.0) == 29800.0
    assert policy.sort_key(starved, 29799.0)[0] == 1
    assert policy.sort_key(starved, 29800.0)[0] == 0
    assert policy.key_stable_until(starved, 29800.0) == math.inf  # already promoted
    assert policy.key_stable_until(job("fresh"), 0.0) == math.inf  # Q1 jobs never change queue
    assert TiresiasPolicy(promote_knob=None).key_stable_until(starved, 2000.0) == math.inf


@pytest.mark.parametrize(
    "options",
    [{"queue_thresholds_gpu_s": (100.0, 100.0)}, {"queue_thresholds_gpu_s": (-1.0,)}, {"promote_knob": 0.0}],
    ids=["not increasing", "negative threshold", "zero knob"],
)
def test_rejects_bad_options(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be"):
        TiresiasPolicy(**options)  # type: ignore[arg-type]


def test_the_owners_run_start_service_decides_where_the_run_began() -> None:
    # Rebuilt from the snapshot (no resumed_at), the run began at 3700 - 200 = 3500 GPU-s, below the
    # 3600 threshold; the owner says it began at 3650 (e.g. it counts service from the first
    # progress, after a restore): the job ran in the lower queue, so it stays ahead of "waiting".
    demoted = job("running", submit=10.0, on=(0,), service=3700.0, executed=3700.0, started=5000.0)
    waiting = job("waiting", submit=0.0, service=4000.0, executed=4000.0, queued_since=4500.0, preempted=4500.0)
    policy = TiresiasPolicy()
    jobs = jobs_of(demoted, waiting)
    state = cluster(2, 4, running=[demoted])
    assert list(policy.rank(jobs, state, 5200.0).order) == ["waiting", "running"]
    demoted.run_start_service = 3650.0
    assert list(policy.rank(jobs, state, 5200.0).order) == ["running", "waiting"]
