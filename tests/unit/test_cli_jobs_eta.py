"""`roundhouse jobs` shows a queued job's ETA in START (issue 14, item 7), without a cluster."""

from __future__ import annotations

import time

import pytest

from roundhouse.commands.jobs import format_table
from schemas.control import JobView
from schemas.job import JobClass

NOW = 1_800_000_000.0


def view(job_id: str, status: str = "queued", **fields: object) -> JobView:
    return JobView.model_validate({"job_id": job_id, "name": job_id, "user": "alice", "job_class": JobClass.BE,
                                   "status": status, "gpus": 1, "submit_time": NOW - 300, **fields})  # fmt: skip


def start_column(job: JobView) -> str:
    header, row = format_table([job], now=NOW).splitlines()
    begin = header.index("START")
    end = header.index("RUNTIME")
    return row[begin:end].strip()


@pytest.mark.parametrize(
    ("job", "shown"),
    [
        pytest.param(view("q", eta_s=720.0, eta_time=NOW + 720, eta_quality="durations"),
                     f"in 12m ({time.strftime('%H:%M', time.localtime(NOW + 720))})", id="in 12 minutes"),
        pytest.param(view("q", eta_s=7200.0, eta_time=NOW + 7200, eta_quality="guessed"),
                     f"in ~2h ({time.strftime('%H:%M', time.localtime(NOW + 7200))})", id="guessed"),
        pytest.param(view("q", eta_s=2 * 86400.0, eta_time=NOW + 2 * 86400, eta_quality="durations"),
                     f"in 2d ({time.strftime('%b %d %H:%M', time.localtime(NOW + 2 * 86400))})", id="days away"),
        pytest.param(view("q", eta_s=0.0, eta_time=NOW, eta_quality="durations"), "now", id="due now"),
        pytest.param(view("q", eta_reason="it does not start within 168 h (simulated)"), "-", id="no ETA"),
        pytest.param(view("r", "running", first_start_time=NOW - 60), "1m ago", id="running: its start"),
        pytest.param(view("s", first_start_time=NOW - 600, eta_s=60.0, eta_time=NOW + 60, eta_quality="durations"),
                     f"in 1m ({time.strftime('%H:%M', time.localtime(NOW + 60))})", id="suspended: its ETA"),
    ],
)  # fmt: skip
def test_start_shows_the_eta_of_queued_jobs(job: JobView, shown: str) -> None:
    assert start_column(job) == shown
