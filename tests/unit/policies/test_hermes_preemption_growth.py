"""Hermes §4.1.2: the quantum grows "as the number of preemptions adds up" (per job, capped), on
top of §3.3's loss milestones; the ranking protects a running job for its grown quantum."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.hermes import Hermes
from tests.unit.policies.builders import cluster, job, jobs_of

RUN1 = [(0.0, 2.0), (2.0, 1.6), (4.0, 1.8), (6.0, 1.2), (8.0, 1.4)]
RUN2 = [(40.0, 1.2), (42.0, 1.0), (44.0, 1.1), (46.0, 0.8)]  # one milestone passed (25%)


def hjob(job_id: str, preemptions: int = 0, history: list[tuple[float, float]] | None = None, **kw: Any) -> JobState:
    base = job(job_id, **kw)
    history = history or []
    return dataclasses.replace(
        base, preemptions=preemptions, loss_history=list(history), loss=history[-1][1] if history else None
    )


QUANTUM_CASES: list[tuple[str, dict[str, Any], int, list[tuple[float, float]], float]] = [
    ("never preempted: the base quantum", {}, 0, [], 10.0),
    ("one preemption: x 1.5", {}, 1, [], 15.0),
    ("two preemptions: x 1.5^2", {}, 2, [], 22.5),
    ("capped at 8 quanta by default", {}, 6, [], 80.0),
    ("a huge count neither overflows nor passes the cap", {}, 10**9, [], 80.0),
    ("compounds with a milestone: 10 x 2 x 1.5", {}, 1, RUN1 + RUN2, 30.0),
    ("preemption_growth 1 turns it off", {"preemption_growth": 1.0}, 5, [], 10.0),
    ("its own factor and cap", {"preemption_growth": 2.0, "max_quantum_s": 35.0}, 3, [], 35.0),
    (
        "the default cap never cuts what the milestones alone reach",
        {"growth": 4.0, "preemption_growth": 1.0}, 0, [(0.0, 2.0), (30.0, 0.2)], 640.0,
    ),
    ("no milestones: preemptions alone", {"milestones": ()}, 1, RUN1 + RUN2, 15.0),
]


@pytest.mark.parametrize(
    ("options", "preemptions", "history", "expected"),
    [c[1:] for c in QUANTUM_CASES], ids=[c[0] for c in QUANTUM_CASES],
)
def test_quantum_grows_with_preemptions(
    options: dict[str, Any], preemptions: int, history: list[tuple[float, float]], expected: float
) -> None:
    assert Hermes(**options).quantum_of(hjob("j", preemptions, history)) == pytest.approx(expected)


def test_a_job_preempted_twice_keeps_its_gpu_for_its_grown_quantum() -> None:
    # ``r`` has run 20 s of its current run: past the 10 s base quantum, inside 22.5 s; ``w`` has
    # no loss yet, so it would win (C = +inf) as soon as ``r`` is no longer protected.
    now = 100.0
    running = hjob("r", 2, [(80.0 + t, 2.0 - 0.01 * t) for t in range(20)], on=(0,), started=80.0)
    waiting = hjob("w", queued_since=50.0, seq=1)
    jobs = jobs_of(running, waiting)
    state = cluster(1, 1, running=[running])
    assert SCHEDULING.create("hermes").rank(jobs, state, now).order == ("r", "w")
    without = SCHEDULING.create("hermes", preemption_growth=1.0)
    assert without.rank(jobs, state, now).order == ("w", "r")
    assert SCHEDULING.create("hermes").rank(jobs, state, 80.0 + 22.5).order == ("w", "r")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"preemption_growth": 0.5}, "preemption_growth"),
        ({"preemption_growth": float("inf")}, "preemption_growth"),
        ({"preemption_growth": float("nan")}, "preemption_growth"),
        ({"max_quantum_s": 5.0}, "max_quantum_s"),
        ({"max_quantum_s": float("inf")}, "max_quantum_s"),
    ],
    ids=["below 1", "infinite", "nan", "cap below the quantum", "infinite cap"],
)
def test_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Hermes(**options)
