"""Issue 14, as a researcher meets it on `roundhouse up`'s secured cluster: real worker agents
running real processes on fake GPUs, the CLI with up.json's credentials.

A failed job says why in `roundhouse jobs` and `--json` (exit code or signal, the node, the last
lines of its output, or the launch error), and still does once it has left the scheduler's memory
(read back from the store). `jobs` lists the queue in the scheduler's order with START, RUNTIME and
GPU-h, takes Slurm's and Kueue's status words and refuses unknown ones; `cancel` of an unknown or
finished job is an error with the reason.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import pytest

from roundhouse.local import LocalCluster
from tests.cli_helpers import Job, all_final, by_id, jobs_json, wait_for_jobs
from tests.local_up import cli_where_up_ran, up_for_module

FAILS = (
    "import sys; print('loading data'); "
    "sys.stderr.write('Traceback (most recent call last):\\nValueError: learning rate must be positive\\n'); "
    "sys.exit(3)"
)
KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from up_for_module(
        tmp_path_factory, workers=1, gpus_per_worker=2, round_s=0.5, user="alice",
        scheduler="fifo", log_level="INFO",
    )  # fmt: skip


cli = cli_where_up_ran


def submit(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, job_id: str, *command: str, gpus: int = 1
) -> None:
    assert cli(cluster, monkeypatch, "submit", "--gpus", str(gpus), "--id", job_id, "--", *command) == 0


def wait_final(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], job_ids: list[str]
) -> dict[str, Job]:
    return by_id(wait_for_jobs(cluster, monkeypatch, capsys, all_final(job_ids), *job_ids, timeout_s=60.0))


def test_failed_jobs_say_why(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(cluster, monkeypatch, "fails-1", sys.executable, "-c", FAILS)
    submit(cluster, monkeypatch, "killed-1", sys.executable, "-c", KILLED)
    submit(cluster, monkeypatch, "nosuch-1", "roundhouse-no-such-program")
    jobs = wait_final(cluster, monkeypatch, capsys, ["fails-1", "killed-1", "nosuch-1"])
    node = cluster.node_ids[0]

    fails = jobs["fails-1"]
    assert (fails["status"], fails["exit_code"], fails["signal"]) == ("failed", 3, None)
    assert fails["reason"].startswith(f"exit code 3 on {node}: "), fails["reason"]
    assert fails["reason"].endswith("ValueError: learning rate must be positive"), fails["reason"]

    killed = jobs["killed-1"]
    assert (killed["status"], killed["exit_code"], killed["signal"]) == ("failed", None, 9)
    assert killed["reason"].startswith(f"killed by signal 9 (SIGKILL) on {node}"), killed["reason"]

    nosuch = jobs["nosuch-1"]
    assert nosuch["status"] == "failed"
    assert nosuch["reason"].startswith(f"launch error on {node}: "), nosuch["reason"]
    assert "roundhouse-no-such-program" in nosuch["reason"]

    # The table: one line per job, the headline and the last line of the output.
    capsys.readouterr()
    assert cli(cluster, monkeypatch, "jobs", "--all") == 0
    table = capsys.readouterr().out
    line = next(row for row in table.splitlines() if row.startswith("fails-1"))
    assert f"exit code 3 on {node}: ValueError: learning rate must be positive" in line, table


def test_jobs_lists_the_queue_in_order_with_start_runtime_and_gpu_hours(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sleep = (sys.executable, "-c", "import time; time.sleep(120)")
    submit(cluster, monkeypatch, "blocker-1", *sleep, gpus=2)
    # Admission answers before the scheduler has read the admitted event: an empty listing is "not yet".
    wait_for_jobs(cluster, monkeypatch, capsys, lambda js: bool(js) and js[0]["status"] == "running", "blocker-1")
    # Submitted in this order, so that the queue's order (fifo: arrival) is not the ids' order.
    for job_id in ("zeta-1", "alpha-1", "mid-1"):
        submit(cluster, monkeypatch, job_id, *sleep)
    jobs = wait_for_jobs(
        cluster, monkeypatch, capsys, lambda js: sum(1 for j in js if j["queue_position"] is not None) == 3
    )
    assert [j["job_id"] for j in jobs] == ["zeta-1", "alpha-1", "mid-1", "blocker-1"]
    assert [j["queue_position"] for j in jobs] == [1, 2, 3, None]
    running = jobs[-1]
    assert running["runtime_s"] > 0
    assert running["attained_service_s"] > 0
    assert [j["job_id"] for j in jobs_json(cluster, monkeypatch, capsys, "--sort", "id")] == [
        "alpha-1", "blocker-1", "mid-1", "zeta-1",
    ]  # fmt: skip

    capsys.readouterr()
    assert cli(cluster, monkeypatch, "jobs") == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[7:11] == ["SUBMITTED", "START", "RUNTIME", "GPU-h"], header
    assert [line.split()[0] for line in lines[1:]] == ["zeta-1", "alpha-1", "mid-1", "blocker-1"]
    assert "#1 of 3 waiting" in lines[1]
    blocker = lines[4]
    assert re.search(r" \d+s ago +0:00:\d\d +0\.\d\d ", blocker), blocker

    # Slurm's and Kueue's words; an unknown one is refused with the valid ones.
    pending = {j["job_id"] for j in jobs_json(cluster, monkeypatch, capsys, "--status", "PD")}
    assert pending == {"zeta-1", "alpha-1", "mid-1"}
    assert {j["job_id"] for j in jobs_json(cluster, monkeypatch, capsys, "--status", "R")} == {"blocker-1"}
    assert {j["job_id"] for j in jobs_json(cluster, monkeypatch, capsys, "--status", "Admitted")} == {"blocker-1"}
    with pytest.raises(SystemExit) as exited:
        cli(cluster, monkeypatch, "jobs", "--status", "pendng")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unknown status 'pendng'; valid: held, queued, running" in err, err
    assert "PENDING/PD" in err

    assert cli(cluster, monkeypatch, "cancel", "zeta-1", "alpha-1", "mid-1", "blocker-1") == 0
    wait_final(cluster, monkeypatch, capsys, ["zeta-1", "alpha-1", "mid-1", "blocker-1"])


def test_cancel_of_an_unknown_or_finished_job_is_an_error_with_the_reason(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(cluster, monkeypatch, "quick-1", sys.executable, "-c", "pass")
    assert wait_final(cluster, monkeypatch, capsys, ["quick-1"])["quick-1"]["status"] == "completed"
    capsys.readouterr()
    assert cli(cluster, monkeypatch, "cancel", "quick-1", "ghost-1") == 1
    captured = capsys.readouterr()
    assert "roundhouse cancel: quick-1 already completed; nothing to cancel" in captured.err
    assert "roundhouse cancel: no such job: ghost-1" in captured.err
    assert captured.out == ""
