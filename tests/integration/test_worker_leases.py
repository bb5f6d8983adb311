"""The worker agent over the real bus, with real job processes: grants, revokes, fencing, duplicates, exits.

One worker process (two fake GPUs) serves every test of this module; the test plays the scheduler.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.jobs import CompletionReason, FailureReason, JobCompleted, JobFailed, JobStarted, JobSuspended
from schemas.leases import LeaseAckError
from schemas.metrics import JobMetrics
from schemas.nodes import NodeHeartbeat
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_worker_harness import (
    Facts,
    Scheduler,
    job_id,
    one_worker,
    steps,
    wait_for,
    write_script,
)

NODE = "lease-node"


@dataclass
class Cluster:
    bus: Bus
    facts: Facts
    scheduler: Scheduler
    script: Path
    work_dir: Path

    def ckpt_dir(self, job_id: str) -> Path:
        return self.work_dir / "checkpoints" / job_id

    def loop(self, iterations: int, sleep_s: float = 0.002, mode: str = "obey") -> list[str]:
        return [sys.executable, str(self.script), str(iterations), str(sleep_s), mode]


@pytest.fixture(scope="module")
async def cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    tmp = tmp_path_factory.mktemp("worker")
    async with one_worker(broker.url, tmp, NODE) as (bus, facts, _worker, work_dir):
        yield Cluster(bus, facts, Scheduler(bus), write_script(tmp), work_dir)


async def test_a_granted_job_runs_to_completion_and_reports_it(cluster: Cluster) -> None:
    job = job_id()
    grant = cluster.scheduler.grant(NODE, job, cluster.loop(40))
    ack = await cluster.scheduler.send(grant)
    assert ack.accepted
    assert not ack.duplicate
    started = await cluster.facts.one(JobStarted, job)
    assert started.lease_id == grant.lease_id
    assert started.gpus == [0]
    assert started.epoch == grant.epoch
    end = await cluster.facts.end(job)
    assert isinstance(end, JobCompleted), end
    assert end.iteration == 40
    assert end.exit_code == 0
    assert end.reason is CompletionReason.ITERATIONS
    assert steps(cluster.ckpt_dir(job)) == list(range(40))
    metrics = cluster.facts.of(JobMetrics, job)
    assert metrics
    assert metrics[-1].lease_id == grant.lease_id
    assert metrics[-1].loss is not None
    assert metrics[-1].batch_size == 8
    assert metrics[-1].throughput is not None
    # The lease leaves the heartbeat once its process is gone.
    await wait_for(
        lambda: [
            b
            for b in cluster.facts.of(NodeHeartbeat)
            if b.node_id == NODE and b.ts > end.ts and grant.lease_id not in b.lease_ids
        ]
    )


async def test_a_revoked_job_stops_at_an_iteration_boundary_and_resumes_without_repeating(cluster: Cluster) -> None:
    job = job_id()
    sched = cluster.scheduler
    grant = sched.grant(NODE, job, cluster.loop(300, 0.01))
    assert (await sched.send(grant)).accepted
    await cluster.facts.one(JobStarted, job)
    await wait_for(lambda: len(steps(cluster.ckpt_dir(job))) >= 5, what="some progress")
    assert (await sched.revoke(grant)).accepted
    suspended = await cluster.facts.end(job)
    assert isinstance(suspended, JobSuspended), suspended
    assert not suspended.grace_expired
    assert suspended.stop_s is not None
    assert suspended.stop_s < 5
    assert suspended.checkpoint_iteration == suspended.iteration
    assert suspended.checkpoint_path == str(cluster.ckpt_dir(job) / "checkpoint.pt")
    assert 5 <= suspended.iteration < 300
    # The revoke again: the lease is over, a retry is acked as a duplicate.
    again = await sched.revoke(grant)
    assert again.accepted
    assert again.duplicate
    done_before = steps(cluster.ckpt_dir(job))
    assert done_before == list(range(suspended.iteration))

    second = sched.grant(NODE, job, cluster.loop(300, 0.001), resume=suspended)
    assert (await sched.send(second)).accepted
    resumed = await wait_for(lambda: [e for e in cluster.facts.of(JobStarted, job) if e.lease_id == second.lease_id])
    assert resumed[0].iteration == suspended.iteration
    assert resumed[0].resumed_from == suspended.checkpoint_path
    end = await wait_for(lambda: [e for e in cluster.facts.end_of(job) if e.lease_id == second.lease_id])
    assert isinstance(end[0], JobCompleted)
    assert end[0].iteration == 300
    assert steps(cluster.ckpt_dir(job)) == list(range(300))  # nothing repeated, nothing skipped


async def test_commands_from_an_older_epoch_are_refused(cluster: Cluster) -> None:
    """A newer leader's accepted grant moves the fence; a refused command with a newer epoch does not
    (else one refused command would fence the real leader out for good: issue 18, epoch poisoning)."""
    sched = cluster.scheduler
    job = job_id()
    newer = sched.grant(NODE, job, cluster.loop(5), epoch=sched.epoch + 10)
    first = await sched.send(newer)
    assert first.accepted
    assert first.epoch_seen == sched.epoch + 10
    refused = await sched.send(sched.grant(NODE, job_id(), cluster.loop(5), gpus=[7], epoch=sched.epoch + 1000))
    assert refused.error is LeaseAckError.NO_SUCH_GPU
    assert refused.epoch_seen == sched.epoch + 10  # refused: the fence stayed where the leader's grant put it
    sched.epoch += 10
    stale = sched.grant(NODE, job_id(), cluster.loop(5), epoch=sched.epoch - 1, gpus=[1])
    ack = await sched.send(stale)
    assert not ack.accepted
    assert ack.error is LeaseAckError.STALE_EPOCH
    assert ack.epoch_seen == sched.epoch
    stale_revoke = await sched.revoke(newer, epoch=sched.epoch - 1)
    assert not stale_revoke.accepted
    assert stale_revoke.error is LeaseAckError.STALE_EPOCH
    stale_stop = await sched.stop_at(newer, 1, epoch=sched.epoch - 3)
    assert stale_stop.error is LeaseAckError.STALE_EPOCH
    assert isinstance(await cluster.facts.end(job), JobCompleted)
    assert not cluster.facts.of(JobStarted, stale.job_id)


async def test_duplicate_grants_launch_once_and_busy_or_missing_gpus_are_refused(cluster: Cluster) -> None:
    sched = cluster.scheduler
    job = job_id()
    grant = sched.grant(NODE, job, cluster.loop(200, 0.01), gpus=[1])
    first, second = await sched.send(grant), await sched.send(grant)
    assert first.accepted
    assert not first.duplicate
    assert second.accepted
    assert second.duplicate
    assert second.leases_held is not None
    busy = await sched.send(sched.grant(NODE, job_id(), cluster.loop(5), gpus=[1]))
    assert busy.error is LeaseAckError.GPU_BUSY
    missing = await sched.send(sched.grant(NODE, job_id(), cluster.loop(5), gpus=[7]))
    assert missing.error is LeaseAckError.NO_SUCH_GPU
    unknown = await sched.revoke(sched.grant(NODE, job_id(), cluster.loop(5)))
    assert unknown.error is LeaseAckError.UNKNOWN_LEASE
    await cluster.facts.one(JobStarted, job)
    beat = await wait_for(lambda: [b for b in cluster.facts.of(NodeHeartbeat)
                                   if grant.lease_id in b.lease_ids])  # fmt: skip
    assert beat[-1].leases[[h.lease_id for h in beat[-1].leases].index(grant.lease_id)].gpus == [1]
    assert (await sched.revoke(grant)).accepted
    assert (await sched.revoke(grant)).duplicate
    assert isinstance(await cluster.facts.end(job), JobSuspended)
    assert len(cluster.facts.of(JobStarted, job)) == 1
    assert len(cluster.facts.end_of(job)) == 1


async def test_exit_codes_become_failures_with_the_stderr_tail(cluster: Cluster) -> None:
    sched = cluster.scheduler
    crash = job_id()
    assert (await sched.send(sched.grant(NODE, crash, cluster.loop(10, 0.001, "crash")))).accepted
    failed = await cluster.facts.end(crash)
    assert isinstance(failed, JobFailed), failed
    assert failed.reason is FailureReason.EXIT_CODE
    assert failed.exit_code == 3
    assert failed.iteration == 3
    assert "boom: out of patience" in failed.message

    missing = job_id()
    assert (await sched.send(sched.grant(NODE, missing, ["/nonexistent/python", "x.py"]))).accepted
    launch = await cluster.facts.end(missing)
    assert isinstance(launch, JobFailed)
    assert launch.reason is FailureReason.LAUNCH_ERROR
    assert "/nonexistent/python" in launch.message

    killed = job_id()
    assert await sched.send(sched.grant(NODE, killed, [sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"]))
    by_signal = await cluster.facts.end(killed)
    assert isinstance(by_signal, JobFailed)
    assert by_signal.reason is FailureReason.SIGNAL
    assert by_signal.signal == 9


async def test_a_job_that_ignores_the_lease_is_killed_after_its_grace_period(cluster: Cluster) -> None:
    sched = cluster.scheduler
    job = job_id()
    grant = sched.grant(NODE, job, cluster.loop(0, 0.01, "ignore"))
    assert (await sched.send(grant)).accepted
    await cluster.facts.one(JobStarted, job)
    await wait_for((cluster.ckpt_dir(job) / "checkpoint.pt").exists, what="a first checkpoint")
    assert (await sched.revoke(grant, grace_s=0.5)).accepted
    end = await cluster.facts.end(job)
    assert isinstance(end, JobSuspended), end
    assert end.grace_expired
    assert end.checkpoint_iteration is not None
    assert end.checkpoint_iteration % 5 == 0
    assert end.iteration >= end.checkpoint_iteration
    # SIGTERM is ignored by the job: the agent needed SIGKILL, kill_after_s (0.5 s) after the grace period.
    assert end.stop_s is not None
    assert end.stop_s >= 1.0
