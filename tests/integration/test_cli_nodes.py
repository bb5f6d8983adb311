"""Issue 15, item 3, as an operator meets it on `roundhouse up`'s secured cluster: real worker agents
running a real training job (PyTorch, on fake GPUs), the CLI with up.json's user credentials or
the operator's.

`roundhouse nodes` and `status` answer a user (table and --json); a user's `drain` is refused with
a clear message; the operator drains a node and a new job lands on the other one; `drain --now`
preempts the running job, which checkpoints and resumes on the node that took work again; an
unknown node is an error.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roundhouse.local import LocalCluster
from tests.cli_helpers import jobs_json, run_cli
from tests.local_up import up_for_module

JOBS = Path(__file__).resolve().parents[1] / "e2e" / "jobs"
RESUMING_JOB = f"""
import sys, time
sys.path.insert(0, {str(JOBS)!r})
import torch
from checksum_job import build
from roundhouse import train

job = train.attach()
model, optimizer, loader = build(0)
job.restore(model, optimizer)
print(f"starting at iteration {{job.iteration}}", flush=True)
for x, y in job.iterate(loader, model=model, optimizer=optimizer, max_iterations=100000):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    job.report(loss=loss.item(), batch_size=len(x))
    time.sleep(0.02)
job.close()
"""
"""A long PyTorch job that says which iteration each run starts at (0, or its checkpoint's)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    yield from up_for_module(
        tmp_path_factory, workers=2, gpus_per_worker=1, round_s=0.5, user="alice",
        scheduler="fifo", log_level="INFO",
    )  # fmt: skip


def as_operator(cluster: LocalCluster) -> tuple[str, str]:
    creds = cluster.operator_creds
    assert creds is not None
    return ("--creds", str(creds))


def nodes_json(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
               *args: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    code, out, err = run_cli(cluster, monkeypatch, capsys, "nodes", "--json", *args)
    assert code == 0, err
    return {n["node_id"]: n for n in json.loads(out)["nodes"]}


def every_node(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:  # fmt: skip
    """``nodes --json`` once the scheduler has every worker's registration (up is ready before that)."""
    deadline = time.monotonic() + 30
    while sorted(shown := nodes_json(cluster, monkeypatch, capsys)) != sorted(cluster.node_ids):
        assert time.monotonic() < deadline, f"the scheduler knows {sorted(shown)} of {cluster.node_ids}"
        cluster.check()
        time.sleep(0.2)
    return shown


def job_json(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             job_id: str) -> dict[str, Any] | None:  # fmt: skip
    """The job as `jobs --json` shows it; None while the scheduler has not applied its arrival yet
    (`submit` returns once the stream stored it, before the scheduler consumed it)."""
    jobs = jobs_json(cluster, monkeypatch, capsys, job_id)
    assert len(jobs) <= 1, jobs
    return jobs[0] if jobs else None


def wait_job(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
             job_id: str, what: str, *, done: Any, timeout_s: float = 90.0) -> dict[str, Any]:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        job = job_json(cluster, monkeypatch, capsys, job_id)
        if job is not None and done(job):
            return job
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s: {job}"
        cluster.check()
        time.sleep(0.3)


def test_a_user_reads_nodes_and_status_as_a_table_and_json(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = every_node(cluster, monkeypatch, capsys)
    for node in shown.values():
        assert node["gpus_total"] == 1
        assert node["live"]
        assert node["takes_work"]
    code, out, err = run_cli(cluster, monkeypatch, capsys, "nodes")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split()[:5] == ["NODE", "STATE", "GPUS", "USED", "FREE"]
    assert sorted(r.split()[0] for r in rows) == sorted(cluster.node_ids)

    code, out, err = run_cli(cluster, monkeypatch, capsys, "status", "--json")
    assert code == 0, err
    status = json.loads(out)
    kinds = {s["kind"]: s["instances"] for s in status["services"]}
    assert {"scheduler", "admission", "placement", "metrics", "worker"} <= set(kinds), kinds
    assert len(kinds["worker"]) == 2
    leader = [i for i in kinds["scheduler"] if i["leader"]]
    assert len(leader) == 1
    assert leader[0]["policy"] == "fifo"
    assert status["leader"] == leader[0]["instance"]
    assert status["epoch"] >= 1
    assert kinds["placement"][0]["policy"] == "consolidated"
    code, out, err = run_cli(cluster, monkeypatch, capsys, "status")
    assert code == 0, err
    assert out.startswith(f"leader    {status['leader']} (epoch {status['epoch']})")
    assert "fifo" in out
    assert "consolidated" in out


def test_a_user_may_not_drain_and_an_unknown_node_is_an_error(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    node = sorted(every_node(cluster, monkeypatch, capsys))[0]
    code, _, err = run_cli(cluster, monkeypatch, capsys, "drain", node)
    assert code == 1
    assert "permission denied: alice is a user; only operators may drain nodes" in err
    code, _, err = run_cli(cluster, monkeypatch, capsys, "undrain", node)
    assert code == 1
    assert "only operators may undrain nodes" in err
    assert not nodes_json(cluster, monkeypatch, capsys)[node]["draining"]

    code, _, err = run_cli(cluster, monkeypatch, capsys, "drain", "no-such-node", *as_operator(cluster))
    assert code == 1
    assert err.startswith("roundhouse drain: no such node: no-such-node (known nodes: ")


def test_drain_keeps_new_work_off_and_now_moves_a_running_job_with_its_checkpoint(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = sorted(every_node(cluster, monkeypatch, capsys))
    op = as_operator(cluster)
    code, out, err = run_cli(cluster, monkeypatch, capsys, "drain", first, "--reason", "swap a fan", *op)
    assert code == 0, err
    assert out.strip() == f"{first} drained: it takes no new work"
    drained = nodes_json(cluster, monkeypatch, capsys)[first]
    assert drained["draining"]
    assert drained["drained_by"] == "operator"
    assert drained["drain_reason"] == "swap a fan"
    assert drained["state"] == "drained"

    script = cluster.state_dir.parent / "resuming_job.py"
    script.write_text(RESUMING_JOB)
    code, _, err = run_cli(cluster, monkeypatch, capsys, "submit", "--id", "train-1", "--grace", "30", "--",
                           sys.executable, str(script))  # fmt: skip
    assert code == 0, err
    job = wait_job(cluster, monkeypatch, capsys, "train-1", "train-1 running with progress",
                   done=lambda j: j["status"] == "running" and j["iterations_done"] > 0)  # fmt: skip
    assert list(job["placement"]) == [second]  # never the drained node

    code, out, err = run_cli(cluster, monkeypatch, capsys, "undrain", first, *op)
    assert code == 0, err
    assert out.strip() == f"{first} undrained: it takes new work"
    code, out, err = run_cli(cluster, monkeypatch, capsys, "drain", second, "--now", *op)
    assert code == 0, err
    assert out.strip() == (
        f"{second} drained: it takes no new work; preempting train-1 (each checkpoints and queues again)"
    )
    moved = wait_job(cluster, monkeypatch, capsys, "train-1", "train-1 running on the other node",
                     done=lambda j: j["status"] == "running" and list(j["placement"]) == [first])  # fmt: skip
    assert moved["preemptions"] == 1
    # The second run started from the checkpoint the first wrote when it was preempted, not from 0.
    deadline = time.monotonic() + 60
    while not re.search(r"starting at iteration [1-9]", run_cli(cluster, monkeypatch, capsys, "logs", "train-1",
                                                                "--run", "2")[1]):  # fmt: skip
        assert time.monotonic() < deadline, "the second run's first line"
        time.sleep(0.3)
    assert "starting at iteration 0" in run_cli(cluster, monkeypatch, capsys, "logs", "train-1", "--run", "1")[1]
    table = run_cli(cluster, monkeypatch, capsys, "nodes")[1]
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "train-1" in rows[first]
    assert "by operator" in rows[second]
    assert run_cli(cluster, monkeypatch, capsys, "cancel", "train-1")[0] == 0
    assert run_cli(cluster, monkeypatch, capsys, "undrain", second, *op)[0] == 0
