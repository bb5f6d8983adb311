"""Two-phase preemption of a 2-rank torch.distributed job spread over two workers (real NATS, real processes).

Both ranks must stop after the same iteration, rank 0 must write one consistent checkpoint, and the
job resumed from it must end with exactly the parameters of an uninterrupted run (computed here).
"""

from __future__ import annotations

import socket
import sys
import uuid
from pathlib import Path

import pytest

from schemas.jobs import JobCompleted, JobStarted, JobSuspended
from schemas.leases import LeaseGrant, WorldInfo
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.worker.channel import Channel
from tests.integration.test_worker_harness import REPO, Scheduler, WorkerProcess, collect, wait_for

torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")

ITERATIONS = 200
"""6 s of training at 0.03 s an iteration: the revoke, sent once iteration 5 is seen, lands long before
the end even on a loaded machine (at 60, a slow revoke met a finished job)."""
ARGS = ["--iterations", str(ITERATIONS), "--samples", "512", "--batch-size", "16", "--hidden", "16",
        "--sleep", "0.03", "--log-every", "0", "--device", "cpu"]  # fmt: skip
# (CPU and gloo even on a GPU host: both fake-GPU "nodes" would put their rank on physical GPU 0.)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def grants(sched: Scheduler, job_id: str, resume: JobSuspended | None = None) -> list[LeaseGrant]:
    lease_id = f"l-{uuid.uuid4().hex[:10]}"
    port = free_port()
    out = []
    for node_rank, node in enumerate(("node-a", "node-b")):
        world = WorldInfo(num_nodes=2, node_rank=node_rank, world_size=2, rank_offset=node_rank,
                          coordinator_node="node-a", coordinator_host="127.0.0.1", coordinator_port=port)
        grant = sched.grant(node, job_id, [sys.executable, str(REPO / "examples" / "train_ddp.py"), *ARGS],
                            lease_id=lease_id, world=world, resume=resume, grace_s=30)
        out.append(grant.model_copy(update={"spec": grant.spec.model_copy(update={"env": {"OMP_NUM_THREADS": "1"}})}))
    return out


def channel_of(work_dir: Path, lease_id: str) -> Channel:
    return Channel.open(work_dir / "leases" / lease_id / "rank-0.chan")


def reference_parameters() -> dict[str, object]:
    """The uninterrupted 2-rank run, computed in this process: each step averages both ranks' gradients."""
    sys.path.insert(0, str(REPO / "examples"))
    try:
        import train_mlp
    finally:
        sys.path.remove(str(REPO / "examples"))
    args = train_mlp.parse_args(ARGS)
    data = train_mlp.make_data(args)
    model = train_mlp.make_model(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.MSELoss()
    samplers = [torch.utils.data.DistributedSampler(data, num_replicas=2, rank=r, shuffle=True, seed=args.seed)
                for r in range(2)]  # fmt: skip
    step, epoch = 0, 0
    while step < ITERATIONS:
        loaders = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            loaders.append(iter(torch.utils.data.DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                                                            drop_last=True)))
        for (x0, y0), (x1, y1) in zip(*loaders, strict=True):
            if step == ITERATIONS:
                break
            optimizer.zero_grad()
            ((loss_fn(model(x0), y0) + loss_fn(model(x1), y1)) / 2).backward()
            optimizer.step()
            step += 1
        epoch += 1
    return {k: v.clone() for k, v in model.state_dict().items()}


async def test_a_two_rank_job_over_two_workers_stops_in_step_and_resumes_exactly(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    dirs = {node: tmp_path / node for node in ("node-a", "node-b")}
    # One checkpoint root for both nodes, as on a cluster (shared storage): every rank of the resumed
    # run loads rank 0's checkpoint, and an agent hands a job only a path inside its own root.
    shared = tmp_path / "checkpoints"
    workers = [WorkerProcess(broker.url, namespace, node, path, "--fake-gpus", "1", "--heartbeat-s", "0.2",
                             "--checkpoint-root", str(shared))
               for node, path in dirs.items()]  # fmt: skip
    for worker in workers:
        await worker.start(facts)
    try:
        sched = Scheduler(bus)
        job = "ddp-job"
        first = grants(sched, job)
        for grant in first:
            assert (await sched.send(grant)).accepted
        await wait_for(lambda: len(facts.of(JobStarted, job)) == 2, 30, "both parts started")
        lease = first[0].lease_id
        chan_path = dirs["node-a"] / "leases" / lease / "rank-0.chan"
        await wait_for(lambda: chan_path.exists() and Channel.open(chan_path).iteration >= 5, 60, "training")
        assert (await sched.revoke(first[0])).accepted
        suspended = await facts.end(job, 60)
        assert isinstance(suspended, JobSuspended), suspended
        assert suspended.node_id == "node-a"
        assert not suspended.grace_expired
        assert 5 < suspended.iteration < ITERATIONS
        assert suspended.checkpoint_iteration == suspended.iteration
        assert suspended.checkpoint_path is not None

        # Both ranks stopped after the very same iteration: stop_at.
        rank1 = dirs["node-b"] / "leases" / lease / "rank-0.chan"
        await wait_for(lambda: Channel.open(rank1).status != 0, 30, "rank 1 stopped")
        assert Channel.open(chan_path).iteration == suspended.iteration
        assert Channel.open(rank1).iteration == suspended.iteration
        checkpoint = torch.load(suspended.checkpoint_path, weights_only=True)
        assert checkpoint["iteration"] == suspended.iteration

        second = grants(sched, job, resume=suspended)
        for grant in second:
            assert (await sched.send(grant)).accepted
        done = await wait_for(lambda: [e for e in facts.end_of(job) if e.lease_id == second[0].lease_id], 60)
        assert isinstance(done[0], JobCompleted), done[0]
        assert done[0].iteration == ITERATIONS
        restarted = [e for e in facts.of(JobStarted, job) if e.lease_id == second[0].lease_id]
        assert {e.iteration for e in restarted} == {suspended.iteration}

        final = torch.load(shared / job / "checkpoint.pt", weights_only=True)
        assert final["iteration"] == ITERATIONS
        reference = reference_parameters()
        trained = {k.removeprefix("module."): v for k, v in final["model"].items()}
        assert trained.keys() == reference.keys()
        for name, value in reference.items():
            torch.testing.assert_close(trained[name], value, rtol=1e-4, atol=1e-5, msg=name)
    finally:
        for worker in workers:
            assert await worker.stop() == 0, worker.log_text()
