"""Issue 14, item 7 on `roundhouse up`: the real scheduler, placement and an emulating worker agent.

A queued job behind a running job of known duration gets an ETA close to that job's remaining time,
in `jobs --json` (`eta_s`, `eta_time`, `eta_quality`) and in the table's START; running and
finished jobs have none. The worker emulates jobs 10x faster than their `expected_duration_s`, and
`up --emulate --speedup 10` tells the scheduler's ETA so itself (`--eta-time-scale 10`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from roundhouse.local import LocalCluster
from tests.cli_helpers import Job, by_id, wait_for_jobs
from tests.local_up import cli_where_up_ran, up_for_module

SPEEDUP = 10.0
LONG_S = 300.0
"""The running job's expected duration (30 s of wall time at 10x)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from up_for_module(
        tmp_path_factory, workers=1, gpus_per_worker=1, round_s=5.0, user="alice",
        scheduler="fifo", emulate=True, speedup=SPEEDUP, log_level="INFO", metrics=False,
        extra_args={"scheduler": ["--eta-interval-s", "0.2"]},
    )  # fmt: skip


def wait_for(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    done: Callable[[dict[str, Job]], bool], *args: str,
) -> dict[str, Job]:  # fmt: skip
    """:func:`wait_for_jobs`, the jobs by id."""
    return by_id(wait_for_jobs(cluster, monkeypatch, capsys, lambda jobs: done(by_id(jobs)), *args))


def submit(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, job_id: str, duration_s: float) -> None:
    assert cli_where_up_ran(cluster, monkeypatch, "submit", "--gpus", "1", "--id", job_id, "--expected-duration",
                            str(duration_s), "--", "emulated") == 0  # fmt: skip


def test_a_queued_job_is_expected_when_the_running_one_ends(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(cluster, monkeypatch, "long-1", LONG_S)
    wait_for(cluster, monkeypatch, capsys, lambda jobs: jobs.get("long-1", {}).get("status") == "running")
    submit(cluster, monkeypatch, "next-1", 20.0)
    jobs = wait_for(cluster, monkeypatch, capsys,
                    lambda jobs: jobs.get("next-1", {}).get("eta_s") is not None)  # fmt: skip
    asked = time.time()
    long, queued = jobs["long-1"], jobs["next-1"]
    assert queued["status"] == "queued"
    remaining = LONG_S / SPEEDUP - long["runtime_s"]
    # Generous: the worker starts the job a little after the grant the scheduler counts from, and a
    # fill round follows the completion; the ETA must still name the long job's end, not 0 or 300 s.
    assert abs(queued["eta_s"] - remaining) < 5.0, (queued, long)
    assert abs(queued["eta_time"] - (asked + queued["eta_s"])) < 5.0
    assert queued["eta_quality"] == "durations"
    assert queued["eta_reason"] is None
    for field in ("eta_s", "eta_time", "eta_quality", "eta_reason"):
        assert long[field] is None, (field, long)

    capsys.readouterr()
    assert cli_where_up_ran(cluster, monkeypatch, "jobs") == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("next-1"))
    assert " in " in row, row

    for job_id in ("long-1", "next-1"):
        assert cli_where_up_ran(cluster, monkeypatch, "cancel", job_id) == 0
    final = wait_for(cluster, monkeypatch, capsys,
                     lambda jobs: {j["status"] for j in jobs.values()} == {"cancelled"}, "--all", "long-1",
                     "next-1")  # fmt: skip
    for job in final.values():
        assert job["eta_s"] is None, job
        assert job["eta_reason"] is None, job
