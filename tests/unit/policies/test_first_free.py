"""first-free: lowest free GPU ids, node after node; may split jobs; preempts by ranking."""

from __future__ import annotations

import pytest

from services.core import PLACEMENT
from services.core.decisions import Ranking
from services.core.round import diff_plan
from services.core.state import JobState
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of

CASES: list[tuple[str, list[JobState], list[str], bool, dict[str, tuple[int, ...]], tuple[str, ...]]] = [
    (
        "lowest ids first",
        [job("a", gpus=2), job("b")],
        ["a", "b"],
        True,
        {"a": (0, 1), "b": (2,)},
        (),
    ),
    (
        "splits a job across nodes when the first node is partly busy",
        [job("busy", gpus=3, on=(0, 1, 2)), job("big", gpus=3)],
        ["busy", "big"],
        True,
        {"busy": (0, 1, 2), "big": (3, 4, 5)},
        (),
    ),
    (
        "a higher-ranked waiting job preempts the lowest-ranked running job",
        [job("r1", on=(0, 1, 2, 3)), job("r2", gpus=4, on=(4, 5, 6, 7)), job("w", gpus=4)],
        ["r1", "w", "r2"],
        True,
        {"r1": (0, 1, 2, 3), "w": (4, 5, 6, 7)},
        ("r2",),
    ),
    (
        "non-preemptive ranking only fills free GPUs",
        [job("r2", gpus=4, on=(4, 5, 6, 7)), job("r1", gpus=4, on=(0, 1, 2, 3)), job("w", gpus=4)],
        ["r1", "w", "r2"],
        False,
        {"r1": (0, 1, 2, 3), "r2": (4, 5, 6, 7)},
        (),
    ),
    (
        "the first job that does not fit ends the round (Blox, no backfill)",
        [job("big", gpus=16), job("small")],
        ["big", "small"],
        True,
        {},
        (),
    ),
]


@pytest.mark.parametrize(
    ("items", "order", "preempt", "expected", "suspended"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_placement(
    items: list[JobState],
    order: list[str],
    preempt: bool,
    expected: dict[str, tuple[int, ...]],
    suspended: tuple[str, ...],
) -> None:
    policy = PLACEMENT.create("first-free")
    jobs = jobs_of(*items)
    state = cluster(2, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)
    ranking = Ranking(order=tuple(order), preempt=preempt)
    placement = policy.place(ranking, jobs, state, now=0.0)
    assert allocation(placement) == expected
    plan = diff_plan(placement, ranking, jobs)
    assert plan.suspend == suspended
    assert_unchanged(before, jobs, state)


def test_backfill_lets_small_jobs_past_a_blocked_one() -> None:
    policy = PLACEMENT.create("first-free", backfill=True)
    jobs = jobs_of(job("big", gpus=16), job("small"))
    placement = policy.place(Ranking(order=("big", "small")), jobs, cluster(2, 4), now=0.0)
    assert allocation(placement) == {"small": (0,)}
