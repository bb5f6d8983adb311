"""``roundhouse history``'s rows (``roundhouse.commands.history.trace_rows``): completed jobs only, in
submission order, arrivals from the first, run time without queueing, times scaled; read back by the
simulator's trace reader."""

from __future__ import annotations

from pathlib import Path

from roundhouse.commands.history import trace_rows, write_trace
from roundhouse.sim.traces import read_trace
from schemas.control import JobView
from schemas.job import JobClass


def view(job_id: str, status: str, submit: float, runtime: float, *, gpus: int = 1, user: str = "alice",
         model: str | None = None) -> JobView:
    return JobView(job_id=job_id, name=job_id, user=user, job_class=JobClass.TE if gpus > 1 else JobClass.BE,
                   model=model,
                   status=status, gpus=gpus, submit_time=submit, first_start_time=submit + 50.0,
                   finish_time=submit + 50.0 + runtime, runtime_s=runtime)  # fmt: skip


def test_completed_jobs_in_submission_order_from_the_first(tmp_path: Path) -> None:
    views = [
        view("c", "completed", 1_000_030.0, 12.5, gpus=2, user="bob", model="resnet50"),
        view("a", "completed", 1_000_010.0, 40.0),
        view("f", "failed", 1_000_000.0, 3.0),  # before the first completed one: ignored
        view("x", "cancelled", 1_000_020.0, 1.0),
    ]
    rows = trace_rows(views, time_scale=2.0)
    assert rows == [
        {"arrival_s": "0", "gpus": "1", "duration_s": "80", "class": "BE", "user": "alice", "model": ""},
        {"arrival_s": "40", "gpus": "2", "duration_s": "25", "class": "TE", "user": "bob", "model": "resnet50"},
    ]
    path = tmp_path / "trace.csv"
    write_trace(rows, path)
    jobs = read_trace(path, "roundhouse")
    assert [(j.arrival_s, j.gpus, j.duration_s, j.job_class, j.user) for j in jobs] == [
        (0.0, 1, 80.0, JobClass.BE, "alice"), (40.0, 2, 25.0, JobClass.TE, "bob"),
    ]  # fmt: skip


def test_nothing_finished_gives_no_rows() -> None:
    assert trace_rows([view("r", "running", 5.0, 1.0)]) == []
