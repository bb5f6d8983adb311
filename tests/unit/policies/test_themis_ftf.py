"""Themis finish-time fairness: rho = T_shared / T_ideal, largest rho first."""

from __future__ import annotations

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.estimates import MissingEstimateError
from services.scheduler.policies.themis_ftf import finish_time_fairness
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

NOW = 200.0
# 8 GPUs, N = 3 active jobs. share = min(1, 8 / (3 g)); T_ideal = T_alone / share;
# T_shared = (now - submit) + remaining.
SMALL = job("small", gpus=1, duration=100.0, submit=0.0)  # share 1: ideal 100, shared 200+100: rho 3
WIDE = job("wide", gpus=4, duration=1000.0, submit=100.0, executed=500.0, on=(0, 1, 2, 3))
# wide: share 2/3: ideal 1500, shared 100 + 500: rho 0.4
WHOLE = job("whole", gpus=8, duration=50.0, submit=150.0)  # share 1/3: ideal 150, shared 50+50: rho 2/3


@pytest.mark.parametrize(
    ("item", "rho"), [(SMALL, 3.0), (WIDE, 0.4), (WHOLE, 2 / 3)], ids=["small", "wide", "whole"]
)
def test_rho_by_hand(item: JobState, rho: float) -> None:
    assert finish_time_fairness(item, NOW, active_jobs=3, total_gpus=8) == pytest.approx(rho)


CASES: list[tuple[str, list[JobState], list[str]]] = [
    ("largest rho first", [WIDE, WHOLE, SMALL], ["small", "whole", "wide"]),
    (
        "jobs without an estimate go last in submit order",
        [job("mystery-late", submit=20.0), job("mystery-early", submit=10.0), WIDE],
        ["wide", "mystery-early", "mystery-late"],
    ),
    (
        "a short job that waited long overtakes an older one",
        [job("b", duration=100.0, submit=50.0), job("a", duration=50.0, submit=100.0)],
        # b: (150 + 100) / 100 = 2.5; a: (100 + 50) / 50 = 3.0 -> a first despite later submit
        ["a", "b"],
    ),
]


@pytest.mark.parametrize(("items", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_ranking(items: list[JobState], expected: list[str]) -> None:
    policy = SCHEDULING.create("themis-ftf")
    jobs = jobs_of(*items)
    state = cluster(2, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)

    ranking = policy.rank(jobs, state, NOW)

    assert list(ranking.order) == expected
    assert_unchanged(before, jobs, state)


def test_equal_rho_breaks_by_seq() -> None:
    twins = jobs_of(job("later", duration=100.0, seq=2), job("sooner", duration=100.0, seq=1))
    assert list(SCHEDULING.create("themis-ftf").rank(twins, cluster(1, 4), NOW).order) == ["sooner", "later"]


def test_missing_estimate_error() -> None:
    policy = SCHEDULING.create("themis-ftf", on_missing="error")
    with pytest.raises(MissingEstimateError, match="themis-ftf needs a runtime estimate for job"):
        policy.rank(jobs_of(job("mystery"), SMALL), cluster(1, 4), NOW)
