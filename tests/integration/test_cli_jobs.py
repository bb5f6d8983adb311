"""Issue 14, as a researcher meets it on `roundhouse up`'s secured cluster: real worker agents
running real processes on fake GPUs, the CLI with up.json's credentials.

A failed job says why in `roundhouse jobs` and `--json` (exit code or signal, the node, the last
lines of its output, or the launch error), and still does once it has left the scheduler's memory
(read back from the store).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from roundhouse.cli import main
from roundhouse.endpoint import DEFAULT_STATE_DIR
from roundhouse.local import LocalCluster, LocalClusterConfig

FAILS = (
    "import sys; print('loading data'); "
    "sys.stderr.write('Traceback (most recent call last):\\nValueError: learning rate must be positive\\n'); "
    "sys.exit(3)"
)
FINAL = frozenset({"completed", "failed", "cancelled"})
KILLED = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("up")
    config = LocalClusterConfig(
        state_dir=root / DEFAULT_STATE_DIR, workers=1, gpus_per_worker=2, round_s=0.5, user="alice",
        log_level="INFO",
    )  # fmt: skip
    running = LocalCluster(config)
    running.start()
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def cli(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.chdir(cluster.state_dir.parent)  # where `roundhouse up` ran: ./.roundhouse/up.json
    monkeypatch.delenv("ROUNDHOUSE_NATS", raising=False)
    monkeypatch.delenv("ROUNDHOUSE_CREDS", raising=False)
    return main(list(args))


def submit(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, job_id: str, *command: str) -> None:
    assert cli(cluster, monkeypatch, "submit", "--gpus", "1", "--id", job_id, "--", *command) == 0


def jobs_json(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cli(cluster, monkeypatch, "jobs", "--json", *args) == 0, capsys.readouterr().err
    jobs: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["jobs"]
    return jobs


def wait_final(
    cluster: LocalCluster,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    job_ids: list[str],
    timeout_s: float = 60.0,
) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {j["job_id"]: j for j in jobs_json(cluster, monkeypatch, capsys, *job_ids)}
        if len(jobs) == len(job_ids) and all(j["status"] in FINAL for j in jobs.values()):
            return jobs
        assert time.monotonic() < deadline, jobs
        cluster.check()
        time.sleep(0.3)


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
