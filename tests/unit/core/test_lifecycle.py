"""The job lifecycle (``services.core.lifecycle``): each transition's fields, in place and recorded.

The simulator applies these functions to its jobs in place; the scheduler's book records them
(``into=Changes()``) to persist before applying. Both must give the same job, so every case runs
both ways.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from services.core import lifecycle
from services.core.lifecycle import Changes
from services.core.state import JobState, JobStatus
from tests.unit.policies.builders import job


def held() -> JobState:
    return job("j", status=JobStatus.HELD, submit=5.0)


def waiting(since: float | None = 100.0, longest: float = 0.0, first: float | None = None) -> JobState:
    state = job("j", submit=5.0, queued_since=since)
    state.longest_wait_s = longest
    state.first_start_time = first
    return state


def running(first: float = 50.0, preemptions: int = 0) -> JobState:
    state = job("j", submit=5.0, on=[2, 3])
    state.first_start_time = first
    state.last_start_time = first
    state.preemptions = preemptions
    return state


@dataclass
class Case:
    name: str
    before: Callable[[], JobState]
    apply: Callable[..., None]
    expect: dict[str, Any]


CASES = [
    Case("admit: waits from now", held, lambda j, **kw: lifecycle.admit(j, 10.0, **kw),
         {"status": JobStatus.QUEUED, "admit_time": 10.0, "queued_since": 10.0}),
    Case("launch: first run, the wait is the longest so far", waiting,
         lambda j, **kw: lifecycle.launch(j, 400.0, (0, 1), **kw),
         {"status": JobStatus.RUNNING, "gpus": (0, 1), "first_start_time": 400.0, "last_start_time": 400.0,
          "queued_since": None, "longest_wait_s": 300.0}),
    Case("launch: GPUs free later (started) count as the first start, not the decision",
         waiting, lambda j, **kw: lifecycle.launch(j, 400.0, (0,), 410.0, **kw),
         {"first_start_time": 410.0, "last_start_time": 400.0, "longest_wait_s": 300.0}),
    Case("launch: a resumed job keeps its first start and a longer earlier wait",
         lambda: waiting(since=100.0, longest=1000.0, first=20.0), lambda j, **kw: lifecycle.launch(j, 400.0, **kw),
         {"first_start_time": 20.0, "longest_wait_s": 1000.0, "gpus": ()}),
    Case("launch: no wait on record (an interrupted grant restored none) leaves the longest wait",
         lambda: waiting(since=None, longest=50.0), lambda j, **kw: lifecycle.launch(j, 400.0, **kw),
         {"queued_since": None, "longest_wait_s": 50.0, "first_start_time": 400.0}),
    Case("suspend: preempted, counted", lambda: running(preemptions=2),
         lambda j, **kw: lifecycle.suspend(j, 70.0, **kw),
         {"status": JobStatus.QUEUED, "queued_since": 70.0, "gpus": (), "preemptions": 3, "last_preempt_time": 70.0}),
    Case("suspend: a lost run waits again, not counted", lambda: running(preemptions=2),
         lambda j, **kw: lifecycle.suspend(j, 70.0, preempted=False, **kw),
         {"status": JobStatus.QUEUED, "queued_since": 70.0, "gpus": (), "preemptions": 2, "last_preempt_time": None}),
    Case("finish: a waiting job ends now", waiting,
         lambda j, **kw: lifecycle.finish(j, JobStatus.CANCELLED, 90.0, **kw),
         {"status": JobStatus.CANCELLED, "finish_time": 90.0, "queued_since": None, "gpus": ()}),
    Case("finish: a running job ends and frees its GPUs", running,
         lambda j, **kw: lifecycle.finish(j, JobStatus.COMPLETED, 90.0, **kw),
         {"status": JobStatus.COMPLETED, "finish_time": 90.0, "gpus": ()}),
    Case("progress: GPUs x time since the run began", running,
         lambda j, **kw: lifecycle.progress(j, 80.0, since=50.0, service0=100.0, executed0=40.0, gpus=2, **kw),
         {"attained_service": 160.0, "executed_time": 70.0}),
    Case("progress: none before the run began (clock skew)", running,
         lambda j, **kw: lifecycle.progress(j, 40.0, since=50.0, service0=100.0, executed0=40.0, gpus=2, **kw),
         {"attained_service": 100.0, "executed_time": 40.0}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_transition_in_place_and_recorded_agree(case: Case) -> None:
    in_place = case.before()
    case.apply(in_place)
    for name, value in case.expect.items():
        assert getattr(in_place, name) == value, name

    source = case.before()
    untouched = copy.deepcopy(source)
    record = Changes()
    case.apply(source, into=record)
    assert source == untouched  # recording reads the job only
    for name, value in record.fields().items():
        setattr(source, name, value)
    assert source == in_place


def test_a_finish_time_already_set_is_kept() -> None:
    state = running()
    state.finish_time = 60.0
    lifecycle.finish(state, JobStatus.COMPLETED, 90.0)
    assert state.finish_time == 60.0


def test_a_record_holds_only_what_the_transition_wrote() -> None:
    record = Changes()
    lifecycle.admit(held(), 10.0, into=record)
    assert record.fields() == {"status": JobStatus.QUEUED, "admit_time": 10.0, "queued_since": 10.0}
