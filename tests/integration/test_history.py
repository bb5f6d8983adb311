"""`roundhouse history --trace FILE` on `roundhouse up --emulate`'s secured cluster (issue 14, item 8):
finished jobs become a trace that `roundhouse simulate --trace FILE --format roundhouse` replays.

One emulated worker with one GPU and FIFO, so the second and third of alice's jobs queue behind the
first: their exported run time must exclude that wait. The operator's own job is in the operator's
export, not in alice's.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from roundhouse.local import LocalCluster
from tests.cli_helpers import Job, all_final, by_id, wait_for_jobs
from tests.local_up import cli_where_up_ran, up_for_module

SPEEDUP = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from up_for_module(
        tmp_path_factory, workers=1, gpus_per_worker=1, round_s=5.0, user="alice",
        scheduler="fifo", emulate=True, speedup=SPEEDUP, log_level="INFO", metrics=False,
    )  # fmt: skip


def cli(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    return cli_where_up_ran(cluster, monkeypatch, *args)


def wait_completed(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ids: list[str],
    *creds: str,
) -> dict[str, Job]:
    jobs = wait_for_jobs(cluster, monkeypatch, capsys, all_final(ids), "--all", *creds, timeout_s=90.0)
    found = {job_id: job for job_id, job in by_id(jobs).items() if job_id in ids}
    assert all(j["status"] == "completed" for j in found.values()), found
    return found


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_history_exports_finished_jobs_that_simulate_replays(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    operator = ["--creds", str(cluster.operator_creds)]
    # 20, 30 and 10 simulated seconds (2, 3 and 1 s real) on one GPU: b and c wait for a (and c for b).
    ids = ["hist-a", "hist-b", "hist-c"]
    for job_id, duration in zip(ids, ("20", "30", "10"), strict=True):
        assert cli(cluster, monkeypatch, "submit", "--id", job_id, "--expected-duration", duration,
                   "--model", "resnet50", "--", "emulated") == 0  # fmt: skip
    assert cli(cluster, monkeypatch, "submit", "--id", "hist-op", "--expected-duration", "5", *operator,
               "--", "emulated") == 0  # fmt: skip
    views = wait_completed(cluster, monkeypatch, capsys, [*ids, "hist-op"], *operator)

    mine = tmp_path / "alice.csv"
    assert cli(cluster, monkeypatch, "history", "--trace", str(mine), "--time-scale", str(SPEEDUP)) == 0
    rows = read_rows(mine)
    assert list(rows[0]) == ["arrival_s", "gpus", "duration_s", "class", "user", "model"]
    assert len(rows) == 3, rows  # alice's own: not the operator's job
    assert {r["user"] for r in rows} == {"alice"}
    first = views["hist-a"]["submit_time"]
    for row, job_id in zip(rows, ids, strict=True):  # submission order, arrivals from the first
        view = views[job_id]
        assert float(row["arrival_s"]) == pytest.approx((view["submit_time"] - first) * SPEEDUP, abs=1e-3)
        assert float(row["duration_s"]) == pytest.approx(view["runtime_s"] * SPEEDUP, abs=1e-3)
        assert row["gpus"] == "1"
        assert row["class"] == "BE"
        assert row["model"] == "resnet50"  # as submitted: the replay prices its checkpoints as live did
    assert float(rows[0]["arrival_s"]) == 0.0
    # The run time excludes queueing: b and c waited for a, so their JCTs exceed their run times by
    # at least a's run time; and each ran at least its emulated duration.
    run_a = views["hist-a"]["runtime_s"]
    for job_id, row in zip(ids[1:], rows[1:], strict=True):
        view = views[job_id]
        jct = view["finish_time"] - view["submit_time"]
        assert jct - view["runtime_s"] >= run_a - 0.05 > 0, (view, run_a)
        assert float(row["duration_s"]) < jct * SPEEDUP
    for row, emulated_s in zip(rows, (20.0, 30.0, 10.0), strict=True):
        assert float(row["duration_s"]) >= emulated_s - 0.5

    everyone = tmp_path / "all.csv"
    assert cli(cluster, monkeypatch, "history", "--trace", str(everyone), *operator) == 0
    assert sorted(r["user"] for r in read_rows(everyone)) == ["alice", "alice", "alice", "operator"]

    # The export is a trace the simulator replays.
    report_path = tmp_path / "report.json"
    assert cli(cluster, monkeypatch, "simulate", "--trace", str(mine), "--format", "roundhouse",
               "--scheduler", "srtf", "--json", str(report_path)) == 0  # fmt: skip
    report = json.loads(report_path.read_text())
    assert report["jobs"] == 3
    assert report["avg_jct_s"] > 0


def test_history_with_nothing_finished_or_a_bad_path_says_so(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    capsys.readouterr()
    assert cli(cluster, monkeypatch, "history", "--trace", str(tmp_path / "x.csv"), "--user", "nobody") == 1
    assert "no completed jobs" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()
    assert cli(cluster, monkeypatch, "history", "--trace", str(tmp_path / "x.csv"), "--time-scale", "0") == 2
    assert "--time-scale" in capsys.readouterr().err
