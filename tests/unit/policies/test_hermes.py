"""Hermes (seed 003): Eq. 2-4 from loss histories, the growing quantum, the ``hermes``/``rr``/``slaq``
rankings and the ``hermes`` placement (Algorithms 1-2 with G_thres, per-GPU time-sharing)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from services.core import PLACEMENT, SCHEDULING
from services.core.decisions import Ranking
from services.core.state import JobState
from services.scheduler.policies.hermes import Hermes, convergence, last_two_quanta
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of

RUN1 = [(0.0, 2.0), (2.0, 1.6), (4.0, 1.8), (6.0, 1.2), (8.0, 1.4)]  # rep (2.0 + 1.2) / 2 = 1.6
RUN2 = [(40.0, 1.2), (42.0, 1.0), (44.0, 1.1), (46.0, 0.8)]  # rep (1.2 + 0.8) / 2 = 1.0
STEADY = [(float(t), 1.0) for t in range(0, 20, 2)]  # 20 s at a constant loss

HISTORY_CASES: list[tuple[str, list[tuple[float, float]], float, float | None]] = [
    ("no sample: unmeasured", [], 10.0, None),
    ("one quantum: Eq. 4, (2.0 - 1.2) / 5", RUN1, 10.0, 0.16),
    ("two runs: Eq. 3, (1.6 - 1.0) / 4", RUN1 + RUN2, 10.0, 0.15),
    ("a 20 s run is two 10 s quanta: (1 - 1) / 5", STEADY, 10.0, 0.0),
    ("a 20 s quantum holds the whole run: Eq. 4, 0 / 10", STEADY, 20.0, 0.0),
    ("non-finite samples are ignored", [(0.0, 2.0), (1.0, math.nan), (2.0, 1.0)], 10.0, 0.5),
]


@pytest.mark.parametrize(
    ("history", "quantum", "expected"), [c[1:] for c in HISTORY_CASES], ids=[c[0] for c in HISTORY_CASES]
)
def test_convergence(history: list[tuple[float, float]], quantum: float, expected: float | None) -> None:
    c = convergence(history, quantum)
    if expected is None:
        assert c is None
    else:
        assert c == pytest.approx(expected)


def test_quanta_are_anchored_at_samples_and_skip_suspensions() -> None:
    previous, last = last_two_quanta(RUN1 + RUN2, 10.0)
    assert sorted(previous) == sorted(x for _, x in RUN1)
    assert sorted(last) == sorted(x for _, x in RUN2)
    previous, last = last_two_quanta(STEADY, 10.0)
    assert (len(previous), len(last)) == (5, 5)


def hjob(job_id: str, history: list[tuple[float, float]] | None = None, **kw: Any) -> JobState:
    base = job(job_id, **kw)
    history = history or []
    return dataclasses.replace(base, loss_history=list(history), loss=history[-1][1] if history else None)


def test_quantum_grows_with_milestones() -> None:
    policy = Hermes()
    # progress 1 - 1.0 / 1.6 = 0.375: past 25%, not 50% -> 10 s x 2
    assert policy.quantum_of(hjob("j", RUN1 + RUN2)) == 20.0
    assert policy.quantum_of(hjob("j", RUN1)) == 10.0  # first and newest window are the same
    # from 2.0 to 0.2 (rep of a one-sample window): 90% decrease passes all three milestones
    assert policy.quantum_of(hjob("j", [(0.0, 2.0), (30.0, 0.2)])) == 80.0
    assert Hermes(milestones=()).quantum_of(hjob("j", [(0.0, 2.0), (30.0, 0.2)])) == 10.0
    # with Q = 20 the last two quanta are still the two runs (the 32 s gap is skipped)
    assert policy.convergence_of(hjob("j", RUN1 + RUN2)) == pytest.approx(0.15)


NOW = 100.0
RANK_CASES: list[tuple[str, str, dict[str, Any], list[JobState], list[str]]] = [
    (
        "hermes: protected, unmeasured, then largest C; ties keep the running job",
        "hermes",
        {},
        [
            hjob("stalled", [(0.0, 1.0), (2.0, 1.0)], submit=0.0),  # Eq. 4: 0
            hjob("fast", RUN1 + RUN2, submit=1.0, seq=1),  # C 0.15
            hjob("slow", [(0.0, 1.0), (2.0, 0.99), (4.0, 0.98)], submit=2.0, seq=2),  # (1 - .98) / 3
            hjob("new", submit=3.0, seq=3),
            hjob("running-expired", [(70.0 + t, 1.0) for t in range(0, 30, 2)], on=(0,), started=70.0,
                 submit=4.0, seq=4),  # C 0, ran 30 s
            hjob("running-protected", [(95.0, 5.0)], on=(1,), started=95.0, submit=5.0, seq=5),
        ],
        ["running-protected", "new", "fast", "slow", "running-expired", "stalled"],
    ),
    (
        "rr: protected, then by the time each joined the queue; an expired job rejoins now",
        "rr",
        {},
        [
            job("r-exp", on=(0,), started=60.0, submit=0.0),
            job("w1", queued_since=90.0, submit=1.0, seq=1),
            job("w2", queued_since=50.0, submit=2.0, seq=2),
            job("w3", submit=95.0, seq=3),
            job("r-prot", on=(1,), started=80.0, submit=4.0, seq=4),
        ],
        ["r-prot", "w2", "w1", "w3", "r-exp"],
    ),
    (
        "slaq: protected, unmeasured, then highest loss; ties keep the running job",
        "slaq",
        {},
        [
            hjob("a", [(10.0, 2.0)], submit=0.0),
            hjob("b", [(10.0, 3.0)], submit=1.0, seq=1),
            hjob("c", submit=2.0, seq=2),
            hjob("d", [(10.0, 2.0)], on=(0,), started=0.0, submit=3.0, seq=3),
            hjob("prot", [(95.0, 0.1)], on=(1,), started=90.0, submit=4.0, seq=4),
        ],
        ["prot", "c", "b", "d", "a"],
    ),
    (
        "hermes, yield_at_quantum_end: an expired running job goes after every waiting job",
        "hermes",
        {"yield_at_quantum_end": True},
        [
            hjob("stalled", [(0.0, 1.0), (2.0, 1.0)], submit=0.0),
            hjob("fast", RUN1 + RUN2, on=(0,), started=50.0, submit=1.0, seq=1),  # C .15, expired
        ],
        ["stalled", "fast"],
    ),
    ("rr quantum option: 10 s expires r-prot too", "rr", {"quantum_s": 10.0},
     [job("r-prot", on=(1,), started=80.0), job("w", queued_since=90.0, seq=1)], ["w", "r-prot"]),
]


@pytest.mark.parametrize(
    ("name", "options", "items", "expected"), [c[1:] for c in RANK_CASES], ids=[c[0] for c in RANK_CASES]
)
def test_rankings(name: str, options: dict[str, Any], items: list[JobState], expected: list[str]) -> None:
    policy = SCHEDULING.create(name, **options)
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)
    ranking = policy.rank(jobs, state, NOW)
    assert list(ranking.order) == expected
    assert_unchanged(before, jobs, state)


def queued(*ids: str) -> list[JobState]:
    return [job(j, submit=float(i), seq=i) for i, j in enumerate(ids)]


def test_algorithm_2_least_loaded_gpu_with_a_cap() -> None:
    # 2 GPUs, cap 2: j1 -> 0, j2 -> 1, j3 -> 0, j4 -> 1 (ties to the first GPU); j5 waits globally
    policy = PLACEMENT.create("hermes", max_jobs_per_gpu=2)
    items = queued("j1", "j2", "j3", "j4", "j5")
    jobs = jobs_of(*items)
    state = cluster(1, 2)
    before = frozen(jobs, state)
    placement = policy.place(Ranking(order=("j3", "j1", "j4", "j2", "j5")), jobs, state, 0.0)
    assert policy.homes == {"j1": (0,), "j2": (1,), "j3": (0,), "j4": (1,)}  # type: ignore[attr-defined]
    assert allocation(placement) == {"j3": (0,), "j4": (1,)}  # the best-ranked job of each GPU
    assert_unchanged(before, jobs, state)


def test_time_sharing_over_rounds_keeps_homes() -> None:
    policy = PLACEMENT.create("hermes", max_jobs_per_gpu=2)
    items = queued("j1", "j2", "j3", "j4", "j5")
    state = cluster(1, 2)
    first = policy.place(Ranking(order=("j1", "j2", "j3", "j4", "j5")), jobs_of(*items), state, 0.0)
    assert allocation(first) == {"j1": (0,), "j2": (1,)}
    # round 2: j1, j2 run; the ranking now prefers j3, j4: each GPU switches to its own next job
    running = [dataclasses.replace(items[0], status=items[0].status.RUNNING, gpus=(0,)),
               dataclasses.replace(items[1], status=items[1].status.RUNNING, gpus=(1,))]
    jobs = jobs_of(*running, *items[2:])
    state2 = cluster(1, 2, running=running)
    second = policy.place(Ranking(order=("j3", "j4", "j1", "j2", "j5")), jobs, state2, 10.0)
    assert allocation(second) == {"j3": (0,), "j4": (1,)}
    assert second.plan is not None
    assert sorted(second.plan.suspend) == ["j1", "j2"]
    # round 3: j1 has finished; j5 leaves the global queue for GPU 0 (1 job) rather than GPU 1 (2)
    jobs3 = jobs_of(running[1], *items[2:])
    state3 = cluster(1, 2, running=[running[1]])
    policy.place(Ranking(order=("j2", "j3", "j4", "j5")), jobs3, state3, 20.0)
    assert policy.homes["j5"] == (0,)  # type: ignore[attr-defined]


def test_running_jobs_are_pinned_and_preempt_false_keeps_them() -> None:
    running = job("r", on=(1,))
    items = [running, job("w", submit=1.0, seq=1), job("x", submit=2.0, seq=2)]
    jobs = jobs_of(*items)
    state = cluster(1, 2, running=[running])
    policy = PLACEMENT.create("hermes")
    # w -> GPU 0 (0 jobs vs 1); x: 1 job on each GPU -> the first, GPU 0. preempt=False keeps r
    placement = policy.place(Ranking(order=("x", "w", "r"), preempt=False), jobs, state, 0.0)
    assert policy.homes == {"r": (1,), "w": (0,), "x": (0,)}  # type: ignore[attr-defined]
    assert allocation(placement) == {"r": (1,), "x": (0,)}


def test_multi_gpu_job_needs_every_home_gpu() -> None:
    # a runs on GPU 0; b needs 2: Algorithm 2 twice -> GPU 1 (0 jobs), then GPU 0 -> home (0, 1)
    a = job("a", on=(0,))
    b = job("b", gpus=2, submit=1.0, seq=1)
    jobs = jobs_of(a, b)
    state = cluster(1, 2, running=[a])
    first = PLACEMENT.create("hermes").place(Ranking(order=("b", "a")), jobs, state, 0.0)
    assert allocation(first) == {"b": (0, 1)}
    second = PLACEMENT.create("hermes").place(Ranking(order=("a", "b")), jobs, state, 0.0)
    assert allocation(second) == {"a": (0,)}  # b cannot run without GPU 0: GPU 1 idles


@pytest.mark.parametrize(
    ("kind", "name", "options", "match"),
    [
        ("scheduling", "hermes", {"milestones": (0.5, 0.25)}, "increasing"),
        ("scheduling", "hermes", {"growth": 0.5}, "growth"),
        ("scheduling", "rr", {"quantum_s": 0.0}, "quantum_s"),
        ("placement", "hermes", {"max_jobs_per_gpu": 0}, "max_jobs_per_gpu"),
    ],
    ids=["milestones not increasing", "shrinking quantum", "zero quantum", "zero cap"],
)
def test_rejects_bad_options(kind: str, name: str, options: dict[str, Any], match: str) -> None:
    registry = SCHEDULING if kind == "scheduling" else PLACEMENT
    with pytest.raises(ValueError, match=match):
        registry.create(name, **options)  # type: ignore[attr-defined]
