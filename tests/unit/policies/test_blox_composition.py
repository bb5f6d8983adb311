"""Blox §5.1: LAS scheduling composed with load-threshold admission works through the existing
policies, by name, in one round (``services.core.round.run_round``)."""

from __future__ import annotations

import pytest

from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.round import run_round
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of


@pytest.mark.parametrize(
    ("admission", "accepted", "held", "order"),
    [
        # admitted demand a + b = 4 GPUs <= 1.2 x 4 = 4.8: c enters (demand 6 > 4.8), d is held
        ("accept-1.2x", ("c",), ("d",), ["b", "c", "a"]),
        ("accept-all", ("c", "d"), (), ["b", "c", "d", "a"]),
    ],
    ids=["accept-1.2x holds the job past the threshold", "accept-all lets everything in"],
)
def test_las_with_load_threshold_admission(
    admission: str, accepted: tuple[str, ...], held: tuple[str, ...], order: list[str]
) -> None:
    a = job("a", gpus=2, on=(0, 1), service=1000.0, executed=500.0, started=0.0, submit=0.0, seq=0)
    b = job("b", gpus=2, submit=1.0, seq=1, queued_since=1.0)
    offered = [job("c", gpus=2, submit=2.0, seq=2), job("d", gpus=1, submit=3.0, seq=3)]
    jobs = jobs_of(a, b)
    state = cluster(1, 4, running=[a])
    before = frozen(jobs, state)

    result = run_round(
        admission=ADMISSION.create(admission),
        scheduling=SCHEDULING.create("las"),
        placement=PLACEMENT.create("consolidated"),
        offered=offered,
        jobs=jobs,
        cluster=state,
        now=10.0,
    )

    assert result.admission.accepted == accepted
    assert result.admission.held == held
    assert list(result.ranking.order) == order  # LAS: no service first, FIFO among equals
    # b takes the free GPUs 2-3; c preempts a, the job with the most attained service
    assert {k: tuple(sorted(v)) for k, v in result.plan.launch.items()} == {"b": (2, 3), "c": (0, 1)}
    assert result.plan.suspend == ("a",)
    assert_unchanged(before, jobs, state)
