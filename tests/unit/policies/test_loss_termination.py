"""Blox §5.3 loss-based termination as a wrapper around any scheduling policy."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.core import SCHEDULING
from services.core.state import JobState
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of


def ljob(job_id: str, *, target: float | None, loss: float | None, **kw: Any) -> JobState:
    base = job(job_id, **kw)
    spec = base.spec.model_copy(update={"loss_target": target})
    return dataclasses.replace(base, spec=spec, loss=loss)


# threshold 0.2%: a target of 1.0 is reached at loss <= 1.002; a target of -2.0 at loss <= -1.996
CASES: list[tuple[str, float, JobState, bool]] = [
    ("loss above target + 0.2%: keeps running", 0.002, ljob("j", target=1.0, loss=1.0021, on=(0,)), False),
    ("loss within 0.2% above the target: terminated", 0.002, ljob("j", target=1.0, loss=1.0019, on=(0,)), True),
    ("loss below the target: terminated", 0.002, ljob("j", target=1.0, loss=0.5, on=(0,)), True),
    ("threshold 0: exactly the target", 0.0, ljob("j", target=1.0, loss=1.0, on=(0,)), True),
    ("negative target, relative to |target|", 0.002, ljob("j", target=-2.0, loss=-1.997, on=(0,)), True),
    ("negative target, not yet", 0.002, ljob("j", target=-2.0, loss=-1.995, on=(0,)), False),
    ("no target: never", 0.002, ljob("j", target=None, loss=0.0, on=(0,)), False),
    ("no loss reported yet: never", 0.002, ljob("j", target=1.0, loss=None), False),
]


@pytest.mark.parametrize(("threshold", "item", "ends"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_termination_rule(threshold: float, item: JobState, ends: bool) -> None:
    policy = SCHEDULING.create("loss-termination", base="fifo", threshold=threshold)
    jobs = jobs_of(item, job("other", submit=1.0, seq=1))
    state = cluster(1, 4, running=[j for j in jobs.values() if j.gpus])
    before = frozen(jobs, state)
    ranking = policy.rank(jobs, state, 10.0)
    assert ("j" in ranking.terminate) is ends
    assert list(ranking.order) == ["j", "other"]  # fifo's order, untouched
    assert_unchanged(before, jobs, state)


def test_wraps_any_base_by_name_and_keeps_its_behaviour() -> None:
    items = [
        ljob("done", target=1.0, loss=0.9, on=(0,), service=500.0, submit=0.0),
        ljob("young", target=1.0, loss=3.0, on=(1,), service=10.0, submit=1.0, seq=1),
        job("new", submit=2.0, seq=2),
    ]
    jobs = jobs_of(*items)
    state = cluster(1, 4, running=items[:2])
    base = SCHEDULING.create("las").rank(jobs, state, 5.0)
    wrapped_policy = SCHEDULING.create("loss-termination", base="las", base_options={"starvation_s": None})
    wrapped = wrapped_policy.rank(jobs, state, 5.0)
    assert list(wrapped.order) == list(base.order) == ["new", "young", "done"]
    assert wrapped.preempt is base.preempt
    assert set(wrapped.terminate) == {"done"}
    assert "loss 0.9" in wrapped.terminate["done"]
    assert "target 1" in wrapped.terminate["done"]
    assert wrapped_policy.triggers == SCHEDULING.create("las").triggers
    fifo_wrapped = SCHEDULING.create("loss-termination", base="fifo")
    assert getattr(fifo_wrapped, "preemptive") is False  # noqa: B009 - the optional flag


@pytest.mark.parametrize(
    ("options", "match"),
    [({"threshold": -0.1}, "threshold"), ({"base": "loss-termination"}, "itself"), ({"base": "nope"}, "valid")],
    ids=["negative threshold", "wraps itself", "unknown base"],
)
def test_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, LookupError), match=match):
        SCHEDULING.create("loss-termination", **options)
