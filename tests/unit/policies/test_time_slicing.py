"""The quantum of the time-slicing rankings (rr, slaq, hermes): from the launch, and never while restoring."""

from __future__ import annotations

import dataclasses

import pytest

from roundhouse.sim.case import Case, run_case
from services.scheduler.policies.time_slicing import protected
from tests.unit.policies.builders import job


@pytest.mark.parametrize(
    ("started", "resumed", "now", "expected"),
    [
        pytest.param(0.0, None, 29.0, True, id="no-resume-time: counts from the launch"),
        pytest.param(0.0, None, 30.0, False, id="no-resume-time: quantum over at launch + quantum"),
        pytest.param(0.0, 10.0, 29.0, True, id="restored within the quantum: protected to its end"),
        pytest.param(0.0, 10.0, 30.0, False, id="restored within the quantum: competes at its end"),
        pytest.param(0.0, 40.0, 35.0, True, id="restore outlasts the quantum: still restoring"),
        pytest.param(0.0, 30.0, 30.0, True, id="restore equals the quantum: progress has not begun"),
        pytest.param(0.0, 40.0, 41.0, False, id="restore over and quantum over: competes"),
    ],
)
def test_protection_window(started: float, resumed: float | None, now: float, expected: bool) -> None:
    running = dataclasses.replace(job("a", on=[0], started=started), resumed_at=resumed)
    assert protected(running, now, 30.0) is expected


def test_a_waiting_job_is_never_protected() -> None:
    waiting = dataclasses.replace(job("a", started=0.0), resumed_at=0.0)
    assert not protected(waiting, 1.0, 30.0)


def test_round_robin_finishes_when_restore_outlasts_the_quantum() -> None:
    # Default costs: restore + relaunch 20-45 s, about rr's 30 s quantum. Without the restore clause most
    # resumed jobs lost their GPU before progressing and the run never ended (a livelock: 5 of these 6
    # jobs unfinished after 3e6 s).
    case = Case(workload="philly-synthetic", jobs_per_hour=30, cluster="1x2", num_jobs=6, round_s=30,
                scheduler="rr", placement="hermes", seed=1, max_time_s=3e6)
    report = run_case(case).report
    assert report["unfinished"] == 0
    assert report["preemptions"] > 0
