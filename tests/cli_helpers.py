"""The CLI as a test on a ``roundhouse up`` cluster uses it: a command's exit code and output, the jobs
as ``roundhouse jobs --json`` lists them, and waiting until they are as a test needs them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from roundhouse.local import LocalCluster
from tests.local_up import cli_where_up_ran

Job = dict[str, Any]
"""One job of ``roundhouse jobs --json`` (a ``JobView`` as JSON)."""


def run_cli(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str]:
    """``roundhouse ARGS`` where ``up`` ran: its exit code, stdout and stderr (and only its own)."""
    capsys.readouterr()
    code = cli_where_up_ran(cluster, monkeypatch, *args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def jobs_json(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> list[Job]:
    """``roundhouse jobs --json ARGS``'s jobs (the command must succeed)."""
    code, out, err = run_cli(cluster, monkeypatch, capsys, "jobs", "--json", *args)
    assert code == 0, err
    jobs: list[Job] = json.loads(out)["jobs"]
    return jobs


def wait_for_jobs(
    cluster: LocalCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    done: Callable[[list[Job]], bool],
    *args: str,
    timeout_s: float = 30.0,
) -> list[Job]:
    """``jobs --json ARGS`` asked again until ``done`` holds of its jobs (those jobs), failing after
    ``timeout_s`` with the last listing, or at once if a part of the cluster died."""
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = jobs_json(cluster, monkeypatch, capsys, *args)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, jobs
        cluster.check()
        time.sleep(0.2)


def by_id(jobs: list[Job]) -> dict[str, Job]:
    return {job["job_id"]: job for job in jobs}


def all_final(job_ids: list[str]) -> Callable[[list[Job]], bool]:
    """For :func:`wait_for_jobs`: every one of ``job_ids`` is listed, and has finished."""
    from roundhouse.commands.statuses import FINAL

    def done(jobs: list[Job]) -> bool:
        found = by_id(jobs)
        return all(found.get(job_id, {}).get("status") in FINAL for job_id in job_ids)

    return done
