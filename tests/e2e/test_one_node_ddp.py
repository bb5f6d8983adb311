"""A multi-GPU job on ONE node through a real worker agent (real NATS, real processes; issue 14, items 3-4).

* ``distributed``: one process per granted GPU, each with torch.distributed's rank, local rank, world
  size and a rendezvous on this node (``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``): a real
  2-process gloo job initialises with ``env://`` and all-reduces, and both ranks agree.
* Not distributed: one process seeing every granted GPU, a world of one (which may still initialise).
* The job runs in its spec's ``workdir`` (a relative script path works there); a workdir missing on the
  node fails the launch with a launch error that says so.
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from schemas.jobs import FailureReason, JobCompleted, JobFailed, JobStarted
from schemas.leases import LeaseGrant
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_worker_harness import REPO, Scheduler, WorkerProcess, collect

pytest.importorskip("torch", reason="the train extra (torch) is not installed")

GLOO_JOB = textwrap.dedent("""
    import datetime, json, os
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)  # sum over the ranks: 1 + 2 + ... + world
    gathered = [None] * world
    dist.all_gather_object(gathered, rank)
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
             "CUDA_VISIBLE_DEVICES")
    out = {"rank": rank, "world": world, "sum": value.item(), "gathered": gathered, "cwd": os.getcwd(),
           "env": {k: os.environ.get(k) for k in names}}
    with open(f"result-rank{rank}.json", "w") as f:  # relative: lands in the job's workdir
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
""")


def gloo_grant(sched: Scheduler, job_id: str, workdir: Path, *, distributed: bool) -> LeaseGrant:
    grant = sched.grant("node-a", job_id, [sys.executable, "gloo_job.py"], gpus=[0, 1], grace_s=10)
    spec = grant.spec.model_copy(update={"workdir": str(workdir), "distributed": distributed,
                                         "env": {"OMP_NUM_THREADS": "1"}})  # fmt: skip
    return grant.model_copy(update={"spec": spec})


def results(workdir: Path) -> dict[int, dict[str, object]]:
    out = {}
    for path in sorted(workdir.glob("result-rank*.json")):
        data = json.loads(path.read_text())
        out[int(data["rank"])] = data
    return out


async def test_a_distributed_job_on_one_node_runs_a_rank_per_gpu_that_rendezvous_and_agree(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    workdir = tmp_path / "project"  # the directory the job was submitted from
    workdir.mkdir()
    (workdir / "gloo_job.py").write_text(GLOO_JOB)
    worker = WorkerProcess(broker.url, namespace, "node-a", tmp_path / "node-a", "--fake-gpus", "2",
                           "--heartbeat-s", "0.2")  # fmt: skip
    await worker.start(facts)  # the agent's own cwd is the repository, not the workdir
    try:
        sched = Scheduler(bus)
        job = f"ddp-{uuid.uuid4().hex[:6]}"
        assert (await sched.send(gloo_grant(sched, job, workdir, distributed=True))).accepted
        end = await facts.end(job, 90)
        assert isinstance(end, JobCompleted), (end, worker.log_text())
        assert len(facts.of(JobStarted, job)) == 1
        ranks = results(workdir)
        assert sorted(ranks) == [0, 1], worker.log_text()
        ports = set()
        for rank, data in ranks.items():
            env = data["env"]
            assert isinstance(env, dict)
            assert data["world"] == 2
            assert data["sum"] == 3.0  # 1 + 2: both ranks took part and agree
            assert data["gathered"] == [0, 1]
            assert data["cwd"] == str(workdir)
            assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("2", "2", "0")
            assert env["CUDA_VISIBLE_DEVICES"] == str(rank)  # one GPU each
            assert env["MASTER_ADDR"] == "127.0.0.1"
            ports.add(env["MASTER_PORT"])
        assert len(ports) == 1

        # Not distributed: ONE process seeing both GPUs, a world of one (it may still initialise).
        for path in workdir.glob("result-rank*.json"):
            path.unlink()
        single = f"one-{uuid.uuid4().hex[:6]}"
        assert (await sched.send(gloo_grant(sched, single, workdir, distributed=False))).accepted
        end = await facts.end(single, 90)
        assert isinstance(end, JobCompleted), (end, worker.log_text())
        only = results(workdir)
        assert list(only) == [0]
        env = only[0]["env"]
        assert isinstance(env, dict)
        assert (only[0]["world"], only[0]["sum"]) == (1, 1.0)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["CUDA_VISIBLE_DEVICES"]) == ("1", "1", "0,1")
        assert env["MASTER_ADDR"] == "127.0.0.1"
    finally:
        assert await worker.stop() == 0, worker.log_text()


async def test_a_workdir_missing_on_the_node_fails_the_launch_and_says_so(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    worker = WorkerProcess(broker.url, namespace, "node-a", tmp_path / "node-a", "--fake-gpus", "2",
                           "--heartbeat-s", "0.2")  # fmt: skip
    await worker.start(facts)
    try:
        sched = Scheduler(bus)
        job = f"nowhere-{uuid.uuid4().hex[:6]}"
        missing = tmp_path / "not-on-this-node"
        assert (await sched.send(gloo_grant(sched, job, missing, distributed=True))).accepted
        end = await facts.end(job, 30)
        assert isinstance(end, JobFailed), end
        assert end.reason is FailureReason.LAUNCH_ERROR
        assert end.message is not None
        assert f"workdir {missing}" in end.message
        assert "does not exist on this node" in end.message
        assert not missing.exists()  # nothing was created for it
    finally:
        assert await worker.stop() == 0, worker.log_text()


async def test_the_ddp_example_runs_on_one_node_as_submitted(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    """`roundhouse submit --gpus 2 --distributed -- python examples/train_ddp.py` (the examples README's
    command): two ranks on one node, from the repository as the workdir, to the end."""
    facts = await collect(bus)
    worker = WorkerProcess(broker.url, namespace, "node-a", tmp_path / "node-a", "--fake-gpus", "2",
                           "--heartbeat-s", "0.2", "--checkpoint-root", str(tmp_path / "ck"))  # fmt: skip
    await worker.start(facts)
    try:
        sched = Scheduler(bus)
        job = f"ex-{uuid.uuid4().hex[:6]}"
        command = [sys.executable, "examples/train_ddp.py", "--iterations", "20", "--samples", "256",
                   "--batch-size", "16", "--hidden", "8", "--log-every", "0", "--device", "cpu"]  # fmt: skip
        grant = sched.grant("node-a", job, command, gpus=[0, 1], grace_s=10)
        spec = grant.spec.model_copy(update={"workdir": str(REPO), "distributed": True,
                                             "env": {"OMP_NUM_THREADS": "1"}})  # fmt: skip
        assert (await sched.send(grant.model_copy(update={"spec": spec}))).accepted
        end = await facts.end(job, 120)
        assert isinstance(end, JobCompleted), (end, worker.log_text())
        assert end.iteration == 20
        logs = [(tmp_path / "node-a" / "leases" / grant.lease_id / f"rank-{r}.log").read_text() for r in (0, 1)]
        assert "rank 0: finished at iteration 20" in logs[0], logs
        assert "rank 1: finished at iteration 20" in logs[1], logs
    finally:
        assert await worker.stop() == 0, worker.log_text()
