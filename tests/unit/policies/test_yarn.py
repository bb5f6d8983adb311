"""yarn (the Tiresias simulator's ms_yarn): one switch; first node that fits, else whole idle nodes."""

from __future__ import annotations

import pytest

from services.core import PLACEMENT
from services.core.decisions import Ranking
from services.core.state import ClusterState, Gpu, JobState, Node
from tests.unit.policies.builders import allocation, assert_unchanged, frozen, job, jobs_of


def two_switches() -> ClusterState:
    """Switch s0: node-0 (GPUs 0-3), node-1 (4-7); switch s1: node-2 (8-11), node-3 (12-15)."""
    nodes = [Node(f"node-{n}", tuple(range(4 * n, 4 * n + 4)), switch=f"s{n // 2}") for n in range(4)]
    return ClusterState(nodes, [Gpu(g, f"node-{g // 4}", g % 4) for g in range(16)])


CASES: list[tuple[str, list[JobState], dict[str, tuple[int, ...]]]] = [
    (
        "the first node that fits, not the best-fitting one",
        [job("a", on=(0,)), job("b", gpus=3, on=(4, 5, 6)), job("new")],
        {"a": (0,), "b": (4, 5, 6), "new": (1,)},
    ),
    (
        "a job wider than a node takes whole idle nodes, all in one switch",
        [job("a", on=(0,)), job("new", gpus=8)],
        {"a": (0,), "new": tuple(range(8, 16))},
    ),
    (
        "the rest of a wide job comes from the first other node with that many free",
        [job("a", gpus=2, on=(0, 1)), job("new", gpus=6)],
        {"a": (0, 1), "new": (2, 3, 4, 5, 6, 7)},
    ),
    (
        "never across switches: 5 GPUs free in all, but no switch holds an idle node and 1 more",
        [
            job("a", gpus=3, on=(0, 1, 2)),
            job("b", gpus=4, on=(4, 5, 6, 7)),
            job("c", gpus=4, on=(8, 9, 10, 11)),
            job("new", gpus=5),
        ],
        {"a": (0, 1, 2), "b": (4, 5, 6, 7), "c": (8, 9, 10, 11)},
    ),
]


@pytest.mark.parametrize(("items", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_placement(items: list[JobState], expected: dict[str, tuple[int, ...]]) -> None:
    policy = PLACEMENT.create("yarn")
    jobs = jobs_of(*items)
    state = two_switches()
    for j in items:
        if j.gpus:
            state.assign(j.job_id, j.gpus)
    before = frozen(jobs, state)
    ranking = Ranking(order=tuple(j.job_id for j in items), preempt=False)
    placement = policy.place(ranking, jobs, state, now=0.0)
    assert allocation(placement) == expected
    assert_unchanged(before, jobs, state)


def test_a_wide_job_preempts_victims_one_at_a_time_until_it_fits() -> None:
    # "new" (8 GPUs) outranks both running jobs; suspending "low" (node-3) leaves s1 with one idle
    # node, and s0 has none; suspending "mid" too frees node-2: s1 then holds two idle nodes.
    state = two_switches()
    items = [
        job("top", gpus=4, on=(0, 1, 2, 3)),
        job("new", gpus=8),
        job("side", gpus=4, on=(4, 5, 6, 7)),
        job("mid", gpus=4, on=(8, 9, 10, 11)),
        job("low", gpus=4, on=(12, 13, 14, 15)),
    ]
    for j in items:
        if j.gpus:
            state.assign(j.job_id, j.gpus)
    ranking = Ranking(order=("top", "new", "side", "mid", "low"), preempt=True)
    placement = PLACEMENT.create("yarn").place(ranking, jobs_of(*items), state, now=0.0)
    assert allocation(placement) == {"top": (0, 1, 2, 3), "side": (4, 5, 6, 7), "new": tuple(range(8, 16))}
