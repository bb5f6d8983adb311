"""`roundhouse jobs` without a cluster (issue 14): status words and their aliases, queue order, the
table's columns and a failure's one-line reason."""

from __future__ import annotations

import pytest

from roundhouse.cli import main
from roundhouse.commands.jobs import format_table, one_line, queue_order
from roundhouse.commands.statuses import ALIASES, FINAL, STATUSES, UnknownStatusError, parse_statuses
from schemas.control import JobView
from schemas.job import JobClass
from services.core.state import JobStatus


def view(job_id: str, status: str = "queued", **fields: object) -> JobView:
    return JobView.model_validate({"job_id": job_id, "name": job_id, "user": "alice", "job_class": JobClass.BE,
                                   "status": status, "gpus": 1, "submit_time": 100.0, **fields})  # fmt: skip


def test_the_statuses_are_the_schedulers() -> None:
    assert tuple(s.value for s in JobStatus) == STATUSES
    assert all(set(statuses) <= set(STATUSES) for statuses in ALIASES.values())
    assert {s.value for s in JobStatus if s.is_final} == FINAL


@pytest.mark.parametrize(
    ("words", "statuses"),
    [
        (["queued"], ["queued"]),
        (["PENDING"], ["held", "queued"]),
        (["pd"], ["held", "queued"]),
        (["R"], ["running"]),
        (["CD", "F"], ["completed", "failed"]),
        (["CA"], ["cancelled"]),
        (["canceled"], ["cancelled"]),
        (["OOM"], ["failed"]),
        (["Suspended"], ["queued"]),
        (["Admitted"], ["running"]),
        (["QuotaReserved"], ["running"]),
        (["Inadmissible"], ["held"]),
        (["Finished"], ["completed", "failed"]),
        (["running,PD", "R"], ["held", "queued", "running"]),
        (["out-of-memory"], ["failed"]),
    ],
    ids=["ours", "slurm-pending", "slurm-pd", "slurm-r", "slurm-cd-f", "slurm-ca", "us-spelling", "slurm-oom",
         "kueue-suspended", "kueue-admitted", "kueue-quota-reserved", "kueue-inadmissible", "kueue-finished",
         "comma-separated-and-repeated", "dashes"],
)  # fmt: skip
def test_status_words(words: list[str], statuses: list[str]) -> None:
    assert parse_statuses(words) == statuses


def test_an_unknown_status_word_is_an_error_listing_the_valid_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UnknownStatusError, match="unknown status 'waiting'; valid: held, queued, running"):
        parse_statuses(["running", "waiting"])
    with pytest.raises(SystemExit) as exited:
        main(["jobs", "--status", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unknown status 'bogus'" in err
    assert "Kueue's Pending" in err


def test_queue_order_is_the_rankings_then_held_running_and_finished() -> None:
    jobs = [
        view("done-late", "completed", finish_time=300.0),
        view("done-early", "failed", finish_time=200.0),
        view("run-late", "running", first_start_time=150.0),
        view("run-early", "running", first_start_time=120.0),
        view("held", "held"),
        view("arrived-since-2", submit_time=210.0),
        view("arrived-since-1", submit_time=205.0),
        view("second", queue_position=2, submit_time=50.0),
        view("first", queue_position=1, submit_time=90.0),
    ]
    assert [v.job_id for v in queue_order(jobs)] == [
        "first", "second", "arrived-since-1", "arrived-since-2", "held", "run-early", "run-late", "done-early",
        "done-late",
    ]  # fmt: skip


def test_the_table_has_start_runtime_and_gpu_hours() -> None:
    jobs = [
        view("r", "running", gpus=2, submit_time=0.0, first_start_time=3600.0, runtime_s=3723.0,
             attained_service_s=2 * 3723.0, placement={"n0": [0, 1]}),
        view("q", submit_time=7000.0, reason="needs 1 GPU, 0 of 2 free; #1 of 1 waiting in round 4"),
    ]  # fmt: skip
    lines = format_table(jobs, now=7323.0).splitlines()
    assert lines[0].split()[7:11] == ["SUBMITTED", "START", "RUNTIME", "GPU-h"]
    assert lines[1].split()[7:15] == ["2h", "ago", "1h", "ago", "1:02:03", "2.07", "0", "0"]
    assert lines[2].split()[7:12] == ["5m", "ago", "-", "-", "-"]


@pytest.mark.parametrize(
    ("reason", "line"),
    [
        (None, ""),
        ("needs 1 GPU", "needs 1 GPU"),
        ("exit code 3 on n0: rank 0 exited with 3: Traceback (most recent call last):\n  File x\nValueError: lr",
         "exit code 3 on n0: ValueError: lr"),
    ],
    ids=["none", "one-line", "traceback"],
)  # fmt: skip
def test_a_reason_on_one_line(reason: str | None, line: str) -> None:
    assert one_line(reason) == line
