"""The chaos audit (``tests/chaos_cluster.py``) with packing (issue 17): two jobs packed on one GPU are
not a double run, and a job run twice at once on one GPU (packed beside itself) is one.

The audit judges from the workers' facts by job, not by GPU: overlapping runs of *one job* under two
leases are a double run wherever they ran; runs of two jobs may overlap on any GPU."""

from __future__ import annotations

from schemas.base import Event
from schemas.jobs import JobCompleted, JobStarted
from tests.chaos_cluster import lease_runs, overlapping


def started(job_id: str, lease_id: str, ts: float) -> JobStarted:
    return JobStarted(job_id=job_id, lease_id=lease_id, node_id="n0", epoch=1, gpus=[0], ts=ts)


def completed(job_id: str, lease_id: str, ts: float) -> JobCompleted:
    return JobCompleted(job_id=job_id, lease_id=lease_id, node_id="n0", epoch=1, iteration=10, ts=ts)


def test_two_jobs_packed_on_one_gpu_are_not_a_double_run() -> None:
    facts: list[Event] = [
        started("a", "la", 100.0), started("b", "lb", 101.0), completed("b", "lb", 150.0), completed("a", "la", 160.0)
    ]  # fmt: skip
    runs = lease_runs(facts, {})
    assert (runs["la"].start, runs["la"].end, runs["lb"].start, runs["lb"].end) == (100.0, 160.0, 101.0, 150.0)
    assert overlapping(runs.values()) == []


def test_one_job_packed_beside_itself_is_a_double_run() -> None:
    facts: list[Event] = [
        started("a", "la", 100.0), started("a", "la2", 120.0), completed("a", "la2", 150.0), completed("a", "la", 160.0)
    ]  # fmt: skip
    assert overlapping(lease_runs(facts, {}).values()) == [("a", "la", "la2")]
