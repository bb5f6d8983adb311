"""Load-threshold admission (Blox "Accept 1.2x/1.5x"): FIFO while demand <= factor x GPUs."""

from __future__ import annotations

import pytest

from services.admission.policies.load_threshold import LoadThresholdAdmission
from services.core import ADMISSION
from services.core.state import JobState
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

# 8 GPUs: factor 1.2 -> limit 9.6 GPUs of admitted demand; factor 1.0 -> 8.
CASES: list[tuple[str, float, list[int], list[tuple[str, int]], list[str], list[str]]] = [
    ("below the limit every job enters", 1.2, [4], [("x", 2), ("y", 4)], ["x", "y"], []),
    (
        "the job that crosses the limit still enters; the rest wait in order",
        1.2,
        [4, 4],
        [("x", 4), ("y", 1), ("z", 1)],
        ["x"],
        ["y", "z"],
    ),
    ("over the limit everything waits", 1.2, [10], [("x", 1), ("y", 1)], [], ["x", "y"]),
    ("exactly at the limit one more enters", 1.0, [8], [("x", 1), ("y", 1)], ["x"], ["y"]),
    (
        "a small job never overtakes a held one (strict FIFO)",
        1.2,
        [9],
        [("big", 4), ("small", 1)],
        ["big"],
        ["small"],
    ),
    ("nothing offered", 1.2, [2], [], [], []),
    ("factor 1.5: limit 12", 1.5, [9], [("x", 4), ("y", 1)], ["x"], ["y"]),
]


@pytest.mark.parametrize(
    ("factor", "admitted", "offered", "accepted", "held"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_admit(
    factor: float, admitted: list[int], offered: list[tuple[str, int]], accepted: list[str], held: list[str]
) -> None:
    policy = ADMISSION.create("load-threshold", factor=factor)
    jobs = jobs_of(*(job(f"in-{i}", gpus=g) for i, g in enumerate(admitted)))
    new: list[JobState] = [job(name, gpus=g) for name, g in offered]
    state = cluster(2, 4)
    before = frozen(jobs, state)

    verdict = policy.admit(new, jobs, state, 0.0)

    assert list(verdict.accepted) == accepted
    assert list(verdict.held) == held
    assert not verdict.rejected
    assert_unchanged(before, jobs, state)


@pytest.mark.parametrize(("name", "factor"), [("accept-1.2x", 1.2), ("accept-1.5x", 1.5)])
def test_named_settings(name: str, factor: float) -> None:
    policy = ADMISSION.create(name)
    assert isinstance(policy, LoadThresholdAdmission)
    assert policy.factor == factor


def test_rejects_non_positive_factor() -> None:
    with pytest.raises(ValueError, match="factor must be > 0"):
        LoadThresholdAdmission(factor=0.0)
