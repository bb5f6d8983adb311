"""Gavel's allocation LPs (services.core.gavel) on cases small enough to check by hand, and their size."""

from __future__ import annotations

import random
import time

import pytest

from services.core.gavel import AllocJob, AllocProblem, Objective, allocate

TYPES = ("k80", "v100")


def _two_jobs(*, remaining: float = 100.0) -> AllocProblem:
    # One GPU of each type. A speeds up 4x on the V100, B only 1.5x.
    return AllocProblem(
        types=TYPES,
        capacity=(1, 1),
        jobs=(
            AllocJob("a", 1, (1.0, 4.0), remaining_s=remaining, duration_s=remaining),
            AllocJob("b", 1, (1.0, 1.5), remaining_s=remaining, duration_s=remaining),
        ),
    )


def _rate(x: dict[str, float], tput: tuple[float, float]) -> float:
    return x["k80"] * tput[0] + x["v100"] * tput[1]


def test_makespan_equalises_finish_times_at_the_hand_computed_optimum() -> None:
    # Full use of both GPUs: a = (s, 1-s), b = (1-s, s). Rates 4 - 3s and 1 + s/2 are equal at
    # s = 6/7, both 10/7; no allocation gives the slower job more (the rates move in opposite ways).
    x = allocate(_two_jobs(), Objective.MAKESPAN)
    assert x["a"]["k80"] == pytest.approx(6 / 7, abs=2e-5)
    assert x["a"]["v100"] == pytest.approx(1 / 7, abs=2e-5)
    assert x["b"]["v100"] == pytest.approx(6 / 7, abs=2e-5)
    assert _rate(dict(x["a"]), (1.0, 4.0)) == pytest.approx(10 / 7, abs=2e-5)
    assert _rate(dict(x["b"]), (1.0, 1.5)) == pytest.approx(10 / 7, abs=2e-5)


def test_max_min_fairness_normalises_by_the_proportional_share() -> None:
    # Gavel's LAS: maximise min of throughput / proportional throughput. Proportional (half the time
    # on each type): a 2.5, b 1.25. With a = (s, 1-s), b = (1-s, s): a gets (s + 4(1-s)) / 2.5,
    # b gets ((1-s) + 1.5s) / 1.25; equal at s = 1/2, both exactly 1.0.
    x = allocate(_two_jobs(), Objective.MAX_MIN_FAIRNESS)
    assert _rate(dict(x["a"]), (1.0, 4.0)) / 2.5 == pytest.approx(1.0, abs=2e-5)
    assert _rate(dict(x["b"]), (1.0, 1.5)) / 1.25 == pytest.approx(1.0, abs=2e-5)
    for job in ("a", "b"):
        assert sum(x[job].values()) <= 1 + 1e-9
    for t in TYPES:
        assert x["a"][t] + x["b"][t] <= 1 + 1e-9


def test_agnostic_allocation_ignores_speed() -> None:
    # Heterogeneity-agnostic: every type counts as speed 1, so any full split is optimal; each job
    # gets all the time (one GPU each), which the aware LP would not give them on equal terms.
    x = allocate(_two_jobs(), Objective.MAX_MIN_FAIRNESS, heterogeneity_aware=False)
    for job in ("a", "b"):
        assert sum(x[job].values()) == pytest.approx(1.0, abs=2e-5)


def test_finish_time_fairness_gives_the_worse_off_job_more() -> None:
    # Same jobs, but b has waited 500 s already: FTF must give b a faster share than makespan does.
    problem = _two_jobs()
    waited = AllocProblem(problem.types, problem.capacity, (
        problem.jobs[0], AllocJob("b", 1, (1.0, 1.5), remaining_s=100.0, elapsed_s=500.0, duration_s=100.0),
    ))  # fmt: skip
    fair = allocate(waited, Objective.FINISH_TIME_FAIRNESS)
    even = allocate(problem, Objective.FINISH_TIME_FAIRNESS)
    assert _rate(dict(fair["b"]), (1.0, 1.5)) > _rate(dict(even["b"]), (1.0, 1.5)) + 0.05


def test_a_job_wider_than_a_type_gets_none_of_it() -> None:
    problem = AllocProblem(types=TYPES, capacity=(4, 2), jobs=(AllocJob("wide", 4, (1.0, 3.0)),))
    x = allocate(problem, Objective.MAX_MIN_FAIRNESS)
    assert x["wide"]["v100"] == 0.0
    assert x["wide"]["k80"] == pytest.approx(1.0)


@pytest.mark.parametrize("objective", list(Objective))
def test_500_jobs_solve_well_within_a_round(objective: Objective) -> None:
    rng = random.Random(7)
    jobs = tuple(
        AllocJob(f"j{i}", rng.choice((1, 1, 1, 2, 4)), (rng.uniform(0.1, 0.5), rng.uniform(0.5, 1.0), 1.0),
                 remaining_s=rng.uniform(600, 36_000), elapsed_s=rng.uniform(0, 7_200), duration_s=36_000.0)
        for i in range(500)
    )  # fmt: skip
    problem = AllocProblem(types=("k80", "p100", "v100"), capacity=(64, 64, 64), jobs=jobs)
    start = time.perf_counter()
    x = allocate(problem, objective)
    elapsed = time.perf_counter() - start
    assert len(x) == 500
    for t, cap in zip(problem.types, problem.capacity, strict=True):
        assert sum(job.scale * x[job.job_id][t] for job in jobs) <= cap + 1e-6
    # A round is minutes (Gavel: 6 min, Blox: 5 min); a loaded 2-core machine solves this in 0.08 s
    # (max-min, makespan) to 1 s (FTF's bisection, ~20 LPs).
    assert elapsed < 10.0, f"{objective}: {elapsed:.2f} s for 500 jobs"
