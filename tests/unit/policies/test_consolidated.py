"""consolidated: fewest nodes, never split a job that fits on one node, best fit, preemption."""

from __future__ import annotations

import pytest

from services.core import PLACEMENT
from services.core.decisions import Ranking
from services.core.round import diff_plan
from services.core.state import JobState
from tests.unit.policies.builders import allocation, assert_unchanged, cluster, frozen, job, jobs_of

CASES: list[tuple[str, int, list[JobState], list[str], dict[str, tuple[int, ...]], tuple[str, ...]]] = [
    (
        "exact match beats an emptier node",
        3,
        [job("x", on=(0,)), job("y", gpus=3, on=(4, 5, 6)), job("two", gpus=2)],
        ["x", "y", "two"],
        {"x": (0,), "y": (4, 5, 6), "two": (1, 2)},
        (),
    ),
    (
        "best fit: the node with the fewest free GPUs that still suffice",
        3,
        [job("x", gpus=2, on=(0, 1)), job("y", gpus=3, on=(4, 5, 6)), job("one")],
        ["x", "y", "one"],
        {"x": (0, 1), "y": (4, 5, 6), "one": (7,)},
        (),
    ),
    (
        "waits rather than split a job that fits on one node",
        2,
        [job("x", gpus=2, on=(0, 1)), job("y", gpus=2, on=(4, 5)), job("four", gpus=4)],
        ["x", "y", "four"],
        {"x": (0, 1), "y": (4, 5)},
        (),
    ),
    (
        "a job larger than a node takes whole nodes",
        3,
        [job("x", gpus=2, on=(0, 1)), job("big", gpus=8)],
        ["x", "big"],
        {"x": (0, 1), "big": (4, 5, 6, 7, 8, 9, 10, 11)},
        (),
    ),
    (
        # low2, low1, mid are suspended in turn until node-1 has 4 free GPUs; low2's GPUs on node-0
        # stay unused, so low2 keeps running (Blox would leave it suspended).
        "preempts from the bottom until one node has room; spares victims it did not need",
        2,
        [
            job("top", gpus=2, on=(0, 1)),
            job("mid", gpus=2, on=(4, 5)),
            job("low1", gpus=2, on=(6, 7)),
            job("low2", gpus=2, on=(2, 3)),
            job("w", gpus=4),
        ],
        ["top", "w", "mid", "low1", "low2"],
        {"top": (0, 1), "low2": (2, 3), "w": (4, 5, 6, 7)},
        ("low1", "mid"),
    ),
    (
        "victims are given back when even all of them do not make room",
        2,
        [job("r", gpus=4, on=(0, 1, 2, 3)), job("low", on=(4,)), job("w", gpus=8)],
        ["r", "w", "low"],
        {"r": (0, 1, 2, 3), "low": (4,)},
        (),
    ),
]


@pytest.mark.parametrize(
    ("nodes", "items", "order", "expected", "suspended"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_placement(
    nodes: int,
    items: list[JobState],
    order: list[str],
    expected: dict[str, tuple[int, ...]],
    suspended: tuple[str, ...],
) -> None:
    policy = PLACEMENT.create("consolidated")
    jobs = jobs_of(*items)
    state = cluster(nodes, 4, running=[j for j in items if j.gpus])
    before = frozen(jobs, state)
    ranking = Ranking(order=tuple(order))
    placement = policy.place(ranking, jobs, state, now=0.0)
    launched = {k: v for k, v in expected.items() if not jobs[k].gpus}
    assert allocation(placement) == expected
    plan = diff_plan(placement, ranking, jobs)
    assert plan.suspend == suspended
    assert {k: tuple(sorted(v)) for k, v in plan.launch.items()} == launched
    assert_unchanged(before, jobs, state)
